"""After training: `export` (the network as a state_dict, a torch.export program,
ONNX or a model folder with its card) and `predict` (a CSV file).

Kit test: it exports whatever model `project.py` names, and feeds it a batch of
the configured data. Predictions of any shape get columns.
"""

import dataclasses
import functools
import json
import os
import struct
import subprocess
import sys
import zipfile

import lightning
import pytest
import safetensors.torch
import torch
import yaml
from lightning.pytorch import LightningDataModule, LightningModule
from support import (
    PACKAGE,
    PROJECT,
    best_score,
    configured,
    failure,
    first_batch,
    load_checkpoint,
    same_values,
)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from {{ cookiecutter.package_name }}.__main__ import main as command
from {{ cookiecutter.package_name }}.kit import export as export_module
from {{ cookiecutter.package_name }}.kit.checkpoints import CheckpointError
from {{ cookiecutter.package_name }}.kit.cli import main as kit_main
from {{ cookiecutter.package_name }}.kit.draws import global_generators_kept, seed_global_generators
from {{ cookiecutter.package_name }}.kit.export import (
    CLI_INSTANTIATOR,
    ExportError,
    at_least_two,
    clean_state_dict,
    deployable,
    export,
    format_of,
    load_checkpoint_module,
    load_network,
    network_inputs,
    tensors_of,
)
from {{ cookiecutter.package_name }}.kit.folder import FolderError, as_json, unshared
from {{ cookiecutter.package_name }}.kit.predict import PredictionWriter, prediction_columns
from {{ cookiecutter.package_name }}.kit.spec import network_of


def test_exported_network_loads_strictly_and_computes_like_the_checkpoint(
    trained_checkpoint, tmp_path
):
    path = export(trained_checkpoint, tmp_path / "model.pt", PROJECT)
    exported = torch.load(path, map_location="cpu", weights_only=True)
    assert exported["state_dict"] and not any("_orig_mod" in k for k in exported["state_dict"])
    network = load_network(path, PROJECT)  # rebuilt from the record, loaded with strict=True
    module, _ = load_checkpoint_module(trained_checkpoint, PROJECT)
    attribute, inner = network_of(module, PROJECT.network)
    assert type(network) is type(inner) and exported["attribute"] == attribute
    assert not network.training
    for key, value in inner.state_dict().items():
        assert torch.equal(network.state_dict()[key], value), key
    # The module's own predict_step, through the exported network, gives the same outputs
    # (from the same random states, for a step that draws: a generator's noise).
    batch = first_batch(configured(), "predict")
    with torch.no_grad(), global_generators_kept(True):
        seed_global_generators(0)
        expected = module.predict_step(batch, 0)
        seed_global_generators(0)
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
    assert "load_network('out/model.pt', PROJECT)" in capfd.readouterr().out
    assert command(["export", "--ckpt_path=missing.ckpt"]) == 2
    err = capfd.readouterr().err
    assert "error: checkpoint 'missing.ckpt' does not exist" in err and "Traceback" not in err
    assert sorted(p.name for p in workdir.iterdir()) == ["out"]  # nothing written for a failure
    assert [p.name for p in (workdir / "out").iterdir()] == ["model.pt"]  # no temporary files


def test_a_model_folder_loads_without_pickle_and_carries_its_card(
    trained_checkpoint, workdir, capfd
):
    assert command(["export", f"--ckpt_path={trained_checkpoint}", "--output=handover/"]) == 0
    assert "load_network('handover', PROJECT)" in capfd.readouterr().out
    folder = workdir / "handover"
    assert not list(workdir.glob(".*"))  # nothing half-written beside it
    layout = ["README.md", "config.json", "model.safetensors", "training_config.yaml"]
    assert sorted(p.name for p in folder.iterdir()) == layout
    # The weights are safetensors (no pickle to run) and the checkpoint network's.
    weights = safetensors.torch.load_file(folder / "model.safetensors")
    module, hparams = load_checkpoint_module(trained_checkpoint, PROJECT)
    attribute, inner = network_of(module, PROJECT.network)
    assert weights.keys() == inner.state_dict().keys()
    assert all(torch.equal(weights[k], v) for k, v in inner.state_dict().items())
    network = load_network(folder, PROJECT)
    assert type(network) is type(inner) and not network.training
    inputs = network_inputs(first_batch(configured(), "predict"), PROJECT.network_inputs)
    with torch.no_grad():
        assert same_values(tensors_of(network(*inputs)), tensors_of(inner(*inputs)))
    config = json.loads((folder / "config.json").read_text())
    assert config["attribute"] == attribute and config["hyper_parameters"] == json.loads(
        json.dumps(hparams)
    )
    assert [(i["shape"][1:], i["dtype"]) for i in config["inputs"]] == [
        (list(x.shape[1:]), str(x.dtype).removeprefix("torch.")) for x in inputs
    ]
    assert config["dynamic_dims"] == {str(d): name for d, name in PROJECT.dims.items()}
    # The card: the Hub's metadata, the run's figures, the authors' sections marked.
    card = (folder / "README.md").read_text()
    _, front, body = card.split("---\n", 2)
    assert yaml.safe_load(front)["library_name"] == "pytorch"
    score = best_score(load_checkpoint(trained_checkpoint))
    assert f"| best {PROJECT.monitor} ({PROJECT.mode}) | {score:.4g}, at epoch " in body
    assert "| test | not run on this checkpoint" in body
    assert f"epoch {load_checkpoint(trained_checkpoint)['epoch']}" in body
    assert "## To be written by the model's authors" in body and "_Not written yet._" in body
    # Written again over it: replaced. Over a folder of other files: refused, untouched.
    assert command(["export", f"--ckpt_path={trained_checkpoint}", "--output=handover/"]) == 0
    assert sorted(p.name for p in folder.iterdir()) == layout and not list(workdir.glob(".*"))
    mine = workdir / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert command(["export", f"--ckpt_path={trained_checkpoint}", "--output=mine/"]) == 2
    err = capfd.readouterr().err
    assert "error: 'mine' exists and is not a model folder" in err and "Traceback" not in err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"] and not list(workdir.glob(".*"))


def test_a_model_folder_keeps_tied_weights_and_refuses_what_json_cannot_hold(tmp_path):
    tied = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5, bias=False))
    tied[1].weight = tied[0].weight
    tensors = unshared(tied.state_dict())
    assert torch.equal(tensors["0.weight"], tensors["1.weight"])
    safetensors.torch.save_file(tensors, tmp_path / "w.safetensors")  # refuses shared memory
    assert as_json({"sizes": (1, 2), "name": "x"}, "hyper_parameters") == {
        "sizes": [1, 2],
        "name": "x",
    }
    with pytest.raises(FolderError, match=r"hyper_parameters\.dtype is a dtype"):
        as_json({"dtype": torch.float16}, "hyper_parameters")
    with pytest.raises(FolderError, match="is not a model folder"):
        load_network(tmp_path, PROJECT)


def checkpoint_network_cases(checkpoint) -> list[tuple[tuple, list[torch.Tensor]]]:
    """(inputs, outputs) of the checkpoint's network on a batch of the configured data's
    predict split, and on half of it: the batch sizes an export must take."""
    module, _ = load_checkpoint_module(checkpoint, PROJECT)
    _, network = network_of(module, PROJECT.network)
    inputs = network_inputs(first_batch(configured(), "predict"), PROJECT.network_inputs)
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


def torch_exports_the_network() -> bool:
    """Whether torch.export, called directly, traces the project's network with every
    dimension the project frees left free (Dim.DYNAMIC refuses to fix one)."""
    cli = configured()
    _, network = network_of(cli.model, PROJECT.network)
    inputs = at_least_two(network_inputs(first_batch(cli), PROJECT.network_inputs))
    free = {dim: torch.export.Dim.DYNAMIC for dim in PROJECT.dims}
    shapes = tuple({d: v for d, v in free.items() if d < x.dim()} for x in inputs)
    try:
        torch.export.export(network.eval(), inputs, dynamic_shapes=shapes)
    except Exception:
        return False
    return True


def export_or_skip(args: list[str], output, capfd) -> None:
    """Run `export args`; skip the test, with torch's reason, for a network torch.export
    cannot trace (which the command refuses in one line, writing nothing). A network
    that torch.export traces when called directly is no reason: that refusal fails."""
    code = command(args)
    captured = capfd.readouterr()
    if code == 2 and "cannot trace" in captured.err:
        assert len(captured.err.strip().splitlines()) == 1 and not output.exists()
        assert not torch_exports_the_network(), (
            f"the kit refused a network torch exports: {captured.err}"
        )
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


def test_the_format_follows_the_suffix_unless_named(tmp_path):
    assert format_of("model.pt") == format_of("weights.pth") == format_of("net") == "state_dict"
    assert format_of("model/") == format_of(tmp_path) == "folder"
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


def x_and_scale(batch):
    """A project's `network_inputs`: the two tensors DictNetwork takes, from a dict batch."""
    return batch["x"], batch["scale"]


def test_network_inputs_from_a_batch():
    x, y = torch.zeros(4, 3), torch.ones(4)
    assert network_inputs(x)[0] is x  # a tensor: the input itself
    assert network_inputs((x, y))[0] is x and len(network_inputs([x, y])) == 1
    batch = {"x": x, "scale": torch.ones(4, 1)}
    assert network_inputs(batch, x_and_scale) == (x, batch["scale"])  # Project.network_inputs
    with pytest.raises(ExportError) as error:
        network_inputs(batch)
    message = str(error.value)
    assert "dict with keys ['scale', 'x']" in message
    assert "name a function `batch -> tuple` as Project.network_inputs" in message
    assert len(message.splitlines()) == 1
    with pytest.raises(ExportError, match=r"x_and_scale\) gives tensors of different first"):
        network_inputs({"x": x, "scale": torch.ones(3, 1)}, x_and_scale)


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


def test_which_submodule_is_the_network():
    single = nn.Module()
    single.model, single.loss = nn.Linear(2, 2), nn.MSELoss()
    assert network_of(single)[0] == "model"  # the only child with weights: any name
    two = TwoParts()
    assert network_of(two, "encoder") == ("encoder", two.encoder)  # Project.network
    assert network_of(two) == ("", two)  # several: the whole module
    with pytest.raises(ValueError, match=r"Project.network='net' is not a submodule of TwoParts"):
        network_of(two, "net")


def test_export_takes_the_network_the_project_names(trained_checkpoint, tmp_path):
    module, _ = load_checkpoint_module(trained_checkpoint, PROJECT)
    attribute, inner = network_of(module, PROJECT.network)
    if attribute:  # named, the same network is exported
        named = dataclasses.replace(PROJECT, network=attribute)
        path = export(trained_checkpoint, tmp_path / "named.pt", named)
        exported = torch.load(path, map_location="cpu", weights_only=True)
        assert exported["attribute"] == attribute
    wrong = dataclasses.replace(PROJECT, network="no_such_part")
    with pytest.raises(ExportError) as error:
        export(trained_checkpoint, tmp_path / "wrong.pt", wrong)
    message = str(error.value)
    assert message.startswith("Project.network='no_such_part' is not a submodule of")
    assert len(message.splitlines()) == 1 and not (tmp_path / "wrong.pt").exists()


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


def label_columns(outputs):
    """A project's `prediction_columns`: the best class of each row, and its score."""
    scores, labels = outputs.max(dim=1)
    return {"label": labels, "score": scores}


def test_predict_writes_the_columns_the_project_names(tmp_path):
    writer = PredictionWriter(str(tmp_path / "predictions.csv"))
    trainer = type("OneProcess", (), {"world_size": 1, "global_rank": 0})()
    outputs = [torch.tensor([[0.2, 0.8], [0.9, 0.1]])]
    writer.write_on_epoch_end(trainer, None, outputs, [[[0, 1]]])
    assert (tmp_path / "predictions.csv").read_text().splitlines()[0] == "index,output_0,output_1"
    writer = PredictionWriter(str(tmp_path / "predictions.csv"), columns=label_columns)
    writer.write_on_epoch_end(trainer, None, outputs, [[[0, 1]]])
    lines = (tmp_path / "predictions.csv").read_text().splitlines()
    assert lines == ["index,label,score", "0,1,0.800000011920929", "1,0,0.8999999761581421"]
    # The CLI builds the writer with the project's function.
    project = dataclasses.replace(PROJECT, prediction_columns=label_columns)
    cli = configured_cli(project)
    (found,) = [c for c in cli.trainer.callbacks if isinstance(c, PredictionWriter)]
    assert found.columns is label_columns


def configured_cli(project):
    return kit_main(["--trainer.logger=false"], project=project, run=False)


def save_checkpoint(module: nn.Module, path, **extra) -> None:
    """A checkpoint as Lightning writes it, of the parts export reads: the weights, the
    recorded hyperparameters (if any) and what `extra` adds."""
    checkpoint = {
        "state_dict": module.state_dict(),
        "pytorch-lightning_version": lightning.__version__,
    }
    if getattr(module, "hparams", None):
        checkpoint["hyper_parameters"] = dict(module.hparams.items())
    torch.save({**checkpoint, **extra}, path)


VOCABULARY = 16


class Pooled(nn.Module):
    """Token ids (batch, length) -> two scores: the mean of their embeddings, any length."""

    def __init__(self, width: int = 4):
        super().__init__()
        self.embedding = nn.Embedding(VOCABULARY, width)
        self.head = nn.Linear(width, 2)

    def forward(self, tokens):
        return self.head(self.embedding(tokens).mean(dim=1))


class Flat(Pooled):
    """Token ids of one length only: the embeddings side by side into one linear layer."""

    def __init__(self, width: int = 4, length: int = 6):
        super().__init__(width)
        self.head = nn.Linear(width * length, 2)

    def forward(self, tokens):
        return self.head(self.embedding(tokens).flatten(1))


class SequenceModel(LightningModule):
    def __init__(self, width: int = 4, flat: bool = False):
        super().__init__()
        self.save_hyperparameters()
        self.net = Flat(width) if flat else Pooled(width)


class Unrecorded(LightningModule):
    """A module that takes an argument but does not record it (no save_hyperparameters)."""

    def __init__(self, width: int):
        super().__init__()
        self.net = Pooled(width)


class UnrecordedDefault(Unrecorded):
    def __init__(self, width: int = 4):
        super().__init__(width)


class Tokens(LightningDataModule):
    """Batches of token ids, all of `length`: (tokens, labels), or dicts when `as_dict`."""

    def __init__(self, length: int = 6, as_dict: bool = False):
        super().__init__()
        self.save_hyperparameters()

    def predict_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, VOCABULARY, (8, self.hparams.length), generator=generator)
        labels = torch.randint(0, 2, (8,), generator=generator)
        if self.hparams.as_dict:
            samples = [{"tokens": t, "label": y} for t, y in zip(tokens, labels, strict=True)]
            return DataLoader(samples, batch_size=4)
        return DataLoader(TensorDataset(tokens, labels), batch_size=4)


def tokens_of(batch):
    """Project.network_inputs of a dict batch."""
    return (batch["tokens"],)


SEQUENCES = dataclasses.replace(
    PROJECT,
    model=SequenceModel,
    datamodule=Tokens,
    network=None,
    network_inputs=None,
    prediction_columns=None,
    dynamic_dims=None,
)
LENGTH = {0: "batch", 1: "length"}


def sequence_checkpoint(tmp_path, flat: bool = False, **data) -> tuple:
    """A checkpoint of a SequenceModel trained on Tokens(**data), and its network."""
    module = SequenceModel(flat=flat).eval()
    path = tmp_path / "sequences.ckpt"
    save_checkpoint(module, path, datamodule_hyper_parameters=data)
    return path, module.net


def other_tokens() -> list[torch.Tensor]:
    """Token ids of lengths and batch sizes other than Tokens' (4 x 6)."""
    return [torch.randint(0, VOCABULARY, shape) for shape in ((3, 9), (5, 2), (1, 6))]


@pytest.mark.parametrize("format", ["pt2", "onnx"])
def test_a_free_sequence_length_exports_and_takes_any_length(tmp_path, format):
    if format == "onnx":
        onnx = pytest.importorskip("onnx")
        onnxruntime = pytest.importorskip("onnxruntime")
    ckpt, network = sequence_checkpoint(tmp_path)
    project = dataclasses.replace(SEQUENCES, dynamic_dims=LENGTH)
    path = export(ckpt, tmp_path / f"model.{format}", project)
    if format == "pt2":
        program = torch.export.load(path).module()
        run = program
    else:
        (node,) = onnx.load(path).graph.input
        dims = node.type.tensor_type.shape.dim
        assert [bool(dim.dim_param) for dim in dims] == [True, True], dims  # names, not sizes
        session = onnxruntime.InferenceSession(str(path))

        def run(tokens):
            return torch.from_numpy(session.run(None, {"input_0": tokens.numpy()})[0])

    for tokens in other_tokens():
        with torch.no_grad():
            assert torch.allclose(run(tokens), network(tokens), rtol=1e-4, atol=1e-5)


def test_without_a_free_length_the_export_keeps_the_traced_one(tmp_path):
    onnx = pytest.importorskip("onnx")
    onnxruntime = pytest.importorskip("onnxruntime")
    ckpt, network = sequence_checkpoint(tmp_path)
    assert SEQUENCES.dims == {0: "batch"}  # the default: the batch alone
    program = torch.export.load(export(ckpt, tmp_path / "model.pt2", SEQUENCES)).module()
    tokens = torch.randint(0, VOCABULARY, (3, 6))
    assert torch.allclose(program(tokens), network(tokens), rtol=1e-4, atol=1e-5)  # any batch
    with pytest.raises(Exception, match=r"size\(\)\[1\] == 6"):
        program(torch.randint(0, VOCABULARY, (3, 9)))
    path = export(ckpt, tmp_path / "model.onnx", SEQUENCES)
    (node,) = onnx.load(path).graph.input
    batch, length = node.type.tensor_type.shape.dim
    assert batch.dim_param and (length.dim_param, length.dim_value) == ("", 6)
    session = onnxruntime.InferenceSession(str(path))
    with pytest.raises(Exception, match="Got: 9 Expected: 6"):
        session.run(None, {"input_0": torch.randint(0, VOCABULARY, (3, 9)).numpy()})


class Counted(Pooled):
    """Scores that depend on the batch size being 4: code torch.export specialises."""

    def forward(self, tokens):
        scores = super().forward(tokens)
        return scores if tokens.shape[0] == 4 else scores + 1


@pytest.mark.parametrize(
    ("network", "dims", "expected"),
    [
        (
            Flat(),
            LENGTH,
            "Flat fails on inputs one longer along batch (dim 0), length (dim 1) (first input"
            " 5x7): mat1 and mat2 shapes cannot be multiplied",
        ),
        (
            Counted(),
            {0: "batch"},
            "torch.export cannot trace Counted with batch (dim 0) free: its code fixes batch"
            " (dim 0) of input 0 to 4",
        ),
    ],
    ids=["fixed-length", "fixed-batch"],
)
def test_a_dimension_the_network_cannot_free_is_refused_in_one_line(network, dims, expected):
    tokens = torch.randint(0, VOCABULARY, (4, 6))
    with pytest.raises(ExportError) as error:
        deployable(network.eval(), (tokens,), "pt2", dims=dims)
    message = str(error.value)
    assert message.startswith(expected) and len(message.splitlines()) == 1, message


def test_a_dict_batch_needs_the_projects_network_inputs(tmp_path):
    ckpt, network = sequence_checkpoint(tmp_path, as_dict=True)
    with pytest.raises(ExportError) as error:
        export(ckpt, tmp_path / "model.pt2", SEQUENCES)
    message = str(error.value)
    assert message.startswith(
        "cannot tell the network's inputs from a batch of type dict with keys ['label',"
        " 'tokens']: name a function `batch -> tuple` as Project.network_inputs"
    )
    assert len(message.splitlines()) == 1 and not (tmp_path / "model.pt2").exists()
    project = dataclasses.replace(SEQUENCES, network_inputs=tokens_of, dynamic_dims=LENGTH)
    program = torch.export.load(export(ckpt, tmp_path / "model.pt2", project)).module()
    tokens = torch.randint(0, VOCABULARY, (3, 9))
    assert torch.allclose(program(tokens), network(tokens), rtol=1e-4, atol=1e-5)


def one_line(error) -> str:
    message = str(error.value)
    assert len(message.splitlines()) == 1, message
    return message


def test_a_checkpoint_that_cannot_be_rebuilt_says_why_in_one_line(tmp_path):
    path = tmp_path / "unrecorded.ckpt"
    save_checkpoint(Unrecorded(width=3), path)
    project = dataclasses.replace(SEQUENCES, model=Unrecorded)
    with pytest.raises(ExportError) as error:
        export(path, tmp_path / "model.pt", project)
    message = one_line(error)
    assert message.startswith(f"cannot rebuild Unrecorded from checkpoint '{path}'")
    assert "'width'" in message and "Call self.save_hyperparameters() in its __init__" in message
    # With a default, the module is built, but not as it was trained: the keys say so.
    project = dataclasses.replace(SEQUENCES, model=UnrecordedDefault)
    save_checkpoint(UnrecordedDefault(width=3), path)
    with pytest.raises(ExportError) as error:
        export(path, tmp_path / "model.pt", project)
    message = one_line(error)
    assert "does not fit UnrecordedDefault: different shapes for net.embedding.weight" in message
    assert "must call self.save_hyperparameters()" in message
    assert not (tmp_path / "model.pt").exists()


def middle_of_largest_member(path) -> int:
    """The offset of the middle byte of the largest file stored in a checkpoint's zip
    archive: a byte of the weights (not of the padding between them)."""
    with zipfile.ZipFile(path) as archive:
        info = max(archive.infolist(), key=lambda member: member.file_size)
    with open(path, "rb") as file:
        file.seek(info.header_offset + 26)  # the local header's name and extra lengths
        name_length, extra_length = struct.unpack("<HH", file.read(4))
    return info.header_offset + 30 + name_length + extra_length + info.file_size // 2


def test_a_damaged_checkpoint_is_refused_in_one_line(trained_checkpoint, tmp_path, capfd):
    data = trained_checkpoint.read_bytes()
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError) as error:
        export(cut, tmp_path / "model.pt", PROJECT)
    assert one_line(error).startswith(f"checkpoint '{cut}' ({len(data) // 2} bytes) is truncated")
    flipped = tmp_path / "flipped.ckpt"
    middle = middle_of_largest_member(trained_checkpoint)
    flipped.write_bytes(data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :])
    assert command(["export", f"--ckpt_path={flipped}", f"--output={tmp_path / 'm.pt'}"]) == 2
    err = capfd.readouterr().err
    assert err.startswith(f"error: checkpoint '{flipped}'") and len(err.splitlines()) == 1, err
    assert "Traceback" not in err and not (tmp_path / "m.pt").exists()


def test_a_subclass_the_cli_recorded_is_rebuilt(tmp_path, monkeypatch):
    """The Lightning CLI, given a subclass of the model, records its class path and its
    instantiator beside the arguments; export rebuilds that class, and no other."""
    package_module = sys.modules[PROJECT.model.__module__]

    class Scaled(PROJECT.model):
        def __init__(self, scale: float = 1.0, **kwargs):
            super().__init__(**kwargs)
            self.scale = scale

    Scaled.__module__ = package_module.__name__
    Scaled.__qualname__ = "Scaled"
    monkeypatch.setattr(package_module, "Scaled", Scaled, raising=False)
    module = Scaled(scale=3.0)
    recorded = {
        **dict(module.hparams),
        "_class_path": f"{package_module.__name__}.Scaled",
        "_instantiator": CLI_INSTANTIATOR,
    }
    path = tmp_path / "scaled.ckpt"
    save_checkpoint(module, path, hyper_parameters=recorded)
    loaded, hparams = load_checkpoint_module(path, PROJECT)
    assert type(loaded) is Scaled and loaded.scale == 3.0 and hparams["scale"] == 3.0
    for key, value in module.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    exported = torch.load(export(path, tmp_path / "model.pt", PROJECT), weights_only=True)
    assert exported["module"] == f"{package_module.__name__}.Scaled"
    network = load_network(tmp_path / "model.pt", PROJECT)
    assert type(network) is type(network_of(loaded, PROJECT.network)[1])
    # A class from elsewhere, or one of the package that is not the model, is not built.
    for elsewhere, expected in [
        ("os.system", "which is neither the project's model"),
        (f"{PACKAGE}.kit.export.ExportError", "which is not the project's model"),
    ]:
        save_checkpoint(module, path, hyper_parameters={**recorded, "_class_path": elsewhere})
        with pytest.raises(ExportError) as error:
            load_checkpoint_module(path, PROJECT)
        assert expected in one_line(error) and repr(elsewhere) in str(error.value)
