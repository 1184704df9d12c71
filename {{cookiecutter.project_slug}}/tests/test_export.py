"""After training: `export` (the bare network, strict-loadable) and `predict` (a CSV file)."""

import csv

import torch
from conftest import run_cli

from {{ cookiecutter.package_name }}.cli import DataModule, Model, main
from {{ cookiecutter.package_name }}.export import export, load_network, network_state_dict


def trained_module(checkpoint):
    return Model.load_from_checkpoint(checkpoint, map_location="cpu", weights_only=True).eval()


def test_exported_network_loads_strictly_and_predicts_like_the_module(trained_checkpoint, tmp_path):
    path = export(trained_checkpoint, tmp_path / "model.pt")
    exported = torch.load(path, map_location="cpu", weights_only=True)
    prefixed = [k for k in exported["state_dict"] if k.startswith(("net.", "module.", "_orig_mod"))]
    assert exported["state_dict"] and not prefixed

    # A freshly built network of the recorded class and hyperparameters, strict=True.
    network = load_network(path)
    assert type(network) is type(Model().net)
    module = trained_module(trained_checkpoint)
    data = DataModule()
    x = data.make_splits()["test"].tensors[0][:32]
    with torch.no_grad():
        assert torch.equal(network(x), module(x))


def test_wrapper_prefixes_are_removed():
    weight = torch.zeros(1)
    state_dict = {
        "net._orig_mod.layer.weight": weight,  # torch.compile
        "module.net.head.bias": weight,  # DDP / DataParallel
        "model.net.module.block.0.weight": weight,
        "val_acc.tp": weight,  # not the network's
    }
    assert sorted(network_state_dict(state_dict)) == ["block.0.weight", "head.bias", "layer.weight"]


def test_export_command_and_its_errors(trained_checkpoint, workdir):
    result = run_cli(
        "export", f"--ckpt_path={trained_checkpoint}", "--output=out/model.pt", cwd=workdir
    )
    assert (workdir / "out" / "model.pt").is_file()
    assert "load_network('out/model.pt')" in result.stdout
    missing = run_cli("export", "--ckpt_path=missing.ckpt", cwd=workdir, check=False)
    assert missing.returncode == 2
    assert "error: checkpoint 'missing.ckpt' does not exist" in missing.stderr
    assert not (workdir / "model.pt").exists()


def test_predict_writes_a_csv_row_per_sample(trained_checkpoint, workdir):
    output = "--predictions.output=out/predictions.csv"
    main(["predict", f"--ckpt_path={trained_checkpoint}", output])
    with open(workdir / "out" / "predictions.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    inputs, targets = DataModule().make_splits()["test"].tensors
    assert [int(row["index"]) for row in rows] == list(range(len(inputs)))
    module = trained_module(trained_checkpoint)
    with torch.no_grad():
        expected = module.predict_step(inputs, 0)
{%- if cookiecutter.example == "digits" %}
    assert list(rows[0]) == ["index", "predicted", "probability"]
    probability, predicted = expected.max(dim=1)
    assert [int(row["predicted"]) for row in rows] == predicted.tolist()
    written = torch.tensor([float(row["probability"]) for row in rows])
    assert torch.allclose(written, probability, atol=1e-6)
    assert ((0 < written) & (written <= 1)).all()
{%- else %}
    assert list(rows[0]) == ["index", "prediction"]
    written = torch.tensor([float(row["prediction"]) for row in rows])
    assert torch.allclose(written, expected[:, 0], atol=1e-6)
{%- endif %}
