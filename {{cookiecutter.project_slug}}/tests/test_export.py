"""After training: `export` (the network, strict-loadable) and `predict` (a CSV file).

Kit test: it exports whatever model `project.py` names, and feeds it a batch of
the configured data. Predictions of any shape get columns.
"""

import functools

import pytest
import torch
from conftest import configured, first_batch, same_values
from torch import nn

from {{ cookiecutter.package_name }}.__main__ import main as command
from {{ cookiecutter.package_name }}.kit.export import (
    ExportError,
    clean_state_dict,
    export,
    load_checkpoint_module,
    load_network,
    network_of,
)
from {{ cookiecutter.package_name }}.kit.predict import prediction_columns


def test_exported_network_loads_strictly_and_computes_like_the_checkpoint(
    trained_checkpoint, tmp_path
):
    path = export(trained_checkpoint, tmp_path / "model.pt")
    exported = torch.load(path, map_location="cpu", weights_only=True)
    assert exported["state_dict"] and not any("_orig_mod" in k for k in exported["state_dict"])
    network = load_network(path)  # rebuilt from the record, loaded with strict=True
    module, _ = load_checkpoint_module(trained_checkpoint)
    attribute, inner = network_of(module)
    assert type(network) is type(inner) and exported["attribute"] == attribute
    assert not network.training
    for key, value in inner.state_dict().items():
        assert torch.equal(network.state_dict()[key], value), key
    # The module's own predict_step, through the exported network, gives the same outputs.
    batch = first_batch(configured(), "predict")
    with torch.no_grad():
        expected = module.predict_step(batch, 0)
        if attribute:
            *path, name = attribute.split(".")
            setattr(functools.reduce(getattr, path, module), name, network)
            actual = module.predict_step(batch, 0)
        else:
            actual = network.predict_step(batch, 0)
    assert same_values(actual, expected)


def test_export_command_writes_the_file_and_names_every_error(trained_checkpoint, workdir, capfd):
    assert command(["export", f"--ckpt_path={trained_checkpoint}", "--output=out/model.pt"]) == 0
    assert (workdir / "out" / "model.pt").is_file()
    assert "load_network('out/model.pt')" in capfd.readouterr().out
    assert command(["export", "--ckpt_path=missing.ckpt"]) == 2
    err = capfd.readouterr().err
    assert "error: checkpoint 'missing.ckpt' does not exist" in err and "Traceback" not in err
    assert sorted(p.name for p in workdir.iterdir()) == ["out"]  # nothing written for a failure
    assert [p.name for p in (workdir / "out").iterdir()] == ["model.pt"]  # no temporary files


def test_only_prefixes_that_wrappers_add_are_removed():
    weight = torch.zeros(1)
    assert sorted(
        clean_state_dict({"_orig_mod.layer.weight": weight, "head._orig_mod.bias": weight})
    ) == ["head.bias", "layer.weight"]
    # DDP's module. only when every key has it; a user's own `module`/`model` names stay.
    assert sorted(clean_state_dict({"module.a": weight, "module.b": weight})) == ["a", "b"]
    kept = {"module.a": weight, "model.b": weight}
    assert sorted(clean_state_dict(kept)) == ["model.b", "module.a"]


class TwoParts(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder, self.head, self.loss = nn.Linear(2, 2), nn.Linear(2, 1), nn.MSELoss()


class Declared(TwoParts):
    network_attribute = "encoder"


class Wrong(TwoParts):
    network_attribute = "net"


def test_which_submodule_is_the_network():
    single = nn.Module()
    single.model, single.loss = nn.Linear(2, 2), nn.MSELoss()
    assert network_of(single)[0] == "model"  # the only child with weights: any name
    assert network_of(Declared())[0] == "encoder"
    two = TwoParts()
    assert network_of(two) == ("", two)  # several: the whole module
    with pytest.raises(ExportError, match=r"Wrong.network_attribute = 'net', but that is not a"):
        network_of(Wrong())


@pytest.mark.parametrize(
    ("outputs", "columns"),
    [
        (torch.tensor([0.5, 1.5]), {"output": [0.5, 1.5]}),
        (torch.tensor([[0.5], [1.5]]), {"output": [0.5, 1.5]}),
        (torch.tensor([[1.0, 2.0], [3.0, 4.0]]), {"output_0": [1.0, 3.0], "output_1": [2.0, 4.0]}),
        (
            (torch.tensor([1, 0]), torch.tensor([[0.25, 0.75], [0.5, 0.5]])),
            {"output_0": [1, 0], "output_1_0": [0.25, 0.5], "output_1_1": [0.75, 0.5]},
        ),
        (
            {"label": torch.tensor([3, 4]), "id": ["a", "b"]},
            {"label": [3, 4], "id": ["a", "b"]},
        ),
    ],
    ids=["vector", "column", "matrix", "tuple", "dict"],
)
def test_prediction_columns_of_any_output(outputs, columns):
    assert prediction_columns(outputs) == columns


def test_predictions_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="different numbers of samples"):
        prediction_columns({"a": torch.zeros(2), "b": torch.zeros(3)})
