"""After training: `export` (the network as a state_dict, a torch.export program or
ONNX) and `predict` (a CSV file).

Kit test: it exports whatever model `project.py` names, and feeds it a batch of
the configured data. Predictions of any shape get columns.
"""

import functools
import os
import subprocess
import sys

import pytest
import torch
from conftest import PACKAGE, configured, failure, first_batch, same_values
from torch import nn

from {{ cookiecutter.package_name }}.__main__ import main as command
from {{ cookiecutter.package_name }}.kit import export as export_module
from {{ cookiecutter.package_name }}.kit.export import (
    ExportError,
    clean_state_dict,
    deployable,
    export,
    format_of,
    load_checkpoint_module,
    load_network,
    network_inputs,
    network_of,
    tensors_of,
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


def checkpoint_network_cases(checkpoint) -> list[tuple[tuple, list[torch.Tensor]]]:
    """(inputs, outputs) of the checkpoint's network on a batch of the configured data's
    predict split, and on half of it: the batch sizes an export must take."""
    module, _ = load_checkpoint_module(checkpoint)
    _, network = network_of(module)
    inputs = network_inputs(module, first_batch(configured(), "predict"))
    half = tuple(x[: max(1, len(x) // 2)] for x in inputs)
    with torch.no_grad():
        return [(batch, tensors_of(network(*batch))) for batch in (inputs, half)]


# Loads a .pt2 in a process where this project cannot be imported at all.
TORCH_ALONE = f"""
import sys
sys.modules[{PACKAGE!r}] = None  # any import of the project now fails
import torch
from torch.utils._pytree import tree_leaves

program = torch.export.load(sys.argv[1]).module()
for inputs, expected in torch.load(sys.argv[2], weights_only=True):
    with torch.no_grad():
        outputs = [x for x in tree_leaves(program(*inputs)) if isinstance(x, torch.Tensor)]
    assert len(outputs) == len(expected), (len(outputs), len(expected))
    for got, want in zip(outputs, expected):
        assert got.shape == want.shape, (got.shape, want.shape)
        close = torch.allclose(got.to(want.dtype), want, rtol=1e-4, atol=1e-5)
        assert close, (got - want).abs().max()
    print("batch of", len(inputs[0]), "ok")
"""


def export_or_skip(args: list[str], output, capfd) -> None:
    """Run `export args`; skip the test, with torch's reason, for a network torch.export
    cannot trace (which the command refuses in one line, writing nothing)."""
    code = command(args)
    captured = capfd.readouterr()
    if code == 2 and "cannot trace" in captured.err:
        assert len(captured.err.strip().splitlines()) == 1 and not output.exists()
        pytest.skip(f"this project's network is beyond torch.export: {captured.err.strip()}")
    assert code == 0, captured.err
    assert output.is_file() and f"{output.name} (" in captured.out


def test_pt2_export_runs_with_torch_alone_and_any_batch_size(
    trained_checkpoint, workdir, capfd, monkeypatch
):
    args = ["export", f"--ckpt_path={trained_checkpoint}", "--output=out/model.pt2"]
    export_or_skip(args, workdir / "out" / "model.pt2", capfd)
    assert [p.name for p in (workdir / "out").iterdir()] == ["model.pt2"]  # no temporary files
    # An export whose outputs are off: the check fails, one line says why, nothing is written.
    real_runner = export_module.pt2_runner
    monkeypatch.setattr(
        export_module,
        "pt2_runner",
        lambda data: lambda inputs: [x + 1 for x in real_runner(data)(inputs)],
    )
    assert command([*args[:-1], "--output=out/off.pt2"]) == 2
    err = capfd.readouterr().err
    assert err.startswith("error: the pt2 export") and "differs from the network's" in err
    assert len(err.strip().splitlines()) == 1 and not (workdir / "out" / "off.pt2").exists()
    cases = checkpoint_network_cases(trained_checkpoint)
    cases_file = workdir / "cases.pt"
    torch.save(cases, cases_file)
    elsewhere = workdir / "elsewhere"  # not the project, not its src/
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", TORCH_ALONE, str(workdir / "out" / "model.pt2"), str(cases_file)],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, failure("loading model.pt2 with torch alone", result)
    sizes = [len(inputs[0]) for inputs, _ in cases]
    assert result.stdout.split("\n")[:2] == [f"batch of {n} ok" for n in sizes]


def test_onnx_export_runs_in_onnxruntime_with_a_dynamic_batch(trained_checkpoint, workdir, capfd):
    onnx = pytest.importorskip("onnx")
    onnxruntime = pytest.importorskip("onnxruntime")
    # --format wins over the suffix.
    args = ["export", f"--ckpt_path={trained_checkpoint}", "--output=net.bin", "--format=onnx"]
    export_or_skip(args, workdir / "net.bin", capfd)
    model = onnx.load(workdir / "net.bin")
    for node in model.graph.input:
        assert node.type.tensor_type.shape.dim[0].dim_param, node  # a name, not a fixed size
    session = onnxruntime.InferenceSession(str(workdir / "net.bin"))
    names = [node.name for node in session.get_inputs()]
    for inputs, expected in checkpoint_network_cases(trained_checkpoint):
        feed = {f"input_{i}": x.numpy() for i, x in enumerate(inputs)}
        outputs = session.run(None, {name: feed[name] for name in names})
        assert len(outputs) == len(expected)
        for got, want in zip(outputs, expected, strict=True):
            got = torch.from_numpy(got).to(want.dtype)
            assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), (got - want).abs().max()


def test_the_format_follows_the_suffix_unless_named():
    assert format_of("model.pt") == format_of("weights.pth") == format_of("net") == "state_dict"
    assert format_of("model.pt2") == "pt2" and format_of("dir/Model.ONNX") == "onnx"
    assert format_of("model.pt", "onnx") == "onnx"
    with pytest.raises(ExportError, match="unknown format 'tflite'"):
        format_of("model.pt", "tflite")


class DictNetwork(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(3, 2)

    def forward(self, x, scale):
        return self.layer(x) * scale


class WithHook(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = DictNetwork()

    def network_inputs(self, batch):
        return batch["x"], batch["scale"]


def test_network_inputs_from_a_batch():
    x, y = torch.zeros(4, 3), torch.ones(4)
    plain = nn.Linear(3, 2)
    assert network_inputs(plain, x)[0] is x  # a tensor: the input itself
    assert network_inputs(plain, (x, y))[0] is x and len(network_inputs(plain, [x, y])) == 1
    batch = {"x": x, "scale": torch.ones(4, 1)}
    assert network_inputs(WithHook(), batch) == (x, batch["scale"])  # the module's own hook
    with pytest.raises(ExportError) as error:
        network_inputs(plain, batch)
    message = str(error.value)
    assert "dict with keys ['scale', 'x']" in message
    assert "define `network_inputs(self, batch) -> tuple` on Linear" in message
    with pytest.raises(ExportError, match="different first dimensions"):
        network_inputs(WithHook(), {"x": x, "scale": torch.ones(3, 1)})


class Counting(DictNetwork):
    """Adds how often it was called: a Python number that tracing freezes."""

    calls = 0

    def forward(self, x, scale):
        self.calls += 1
        return super().forward(x, scale) + self.calls


def test_an_export_that_differs_from_the_network_is_refused():
    inputs = (torch.randn(4, 3), torch.ones(4, 1))
    assert deployable(DictNetwork().eval(), inputs, "pt2")  # the bytes of a checked program
    with pytest.raises(ExportError, match=r"output 0 differs from the network's by up to"):
        deployable(Counting().eval(), inputs, "pt2")


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
