"""`<command> export`: the trained network of a checkpoint, as a file or a folder.

    <command> export --ckpt_path CKPT --output model.pt     # state_dict
    <command> export --ckpt_path CKPT --output model.pt2    # torch.export
    <command> export --ckpt_path CKPT --output model.onnx   # ONNX
    <command> export --ckpt_path CKPT --output model/       # a model folder

The suffix of `--output` picks the format (`--format` overrides it); a path
ending in `/`, or an existing folder, is a folder:

- `folder`: safetensors weights, a config.json that rebuilds the network and a
  model card with the run's figures, in the Hugging Face Hub's layout
  (kit/folder.py); `load_network(folder, PROJECT)` reads it back, no pickle.

- `state_dict` (`.pt` or anything else): what `torch.load(..., weights_only=True)`
  reads: the network's own `state_dict` (no `_orig_mod.` of torch.compile, no
  prefix of the LightningModule), with what rebuilds it: the LightningModule's
  class and hyperparameters, and which of its submodules is the network. Load
  it back with

      from <package>.kit.export import load_network
      from <package>.project import PROJECT
      network = load_network("model.pt", PROJECT)   # an nn.Module in eval mode

- `pt2`: a `torch.export` ExportedProgram, graph and weights: it needs torch
  only, not this project (`torch.export.load("model.pt2").module()(x)`).
- `onnx`: an ONNX model for ONNX Runtime and other engines (`pip install
  "<project>[onnx]"` for the exporter and the runtime that checks it).

The two deployable formats are traced on a batch of the project's own
DataModule (built with the data hyperparameters the checkpoint recorded), with
the dimensions `Project.dynamic_dims` names left free (default: the batch, the
first of every input). The network's inputs are the batch itself when it is a
tensor, else its first element; a project whose network takes something else
(several tensors, a dict batch) names a function in `Project.network_inputs`.
Before a file is written, it is read back and its outputs are compared with
the checkpoint network's on that batch and on one of other sizes.

Which submodule is the network: `Project.network` ("net", "model.encoder");
else its only child module with weights; else the whole LightningModule.
"""

import contextlib
import importlib
import inspect
import io
import logging
import os
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any, cast

import torch
from lightning_utilities import apply_to_collection
from torch import nn

from . import folder
from .checkpoints import (
    CheckpointError,
    CheckpointSaveError,
    atomic_save,
    check_checkpoint,
    state_dict_mismatch,
)
from .export_flags import ATOL, FORMATS, RTOL, parser
from .internals import uncompiled
from .runs import run_of_checkpoint
from .sharding import consolidated
from .spec import BATCH_ONLY, Project, network_of

COMPILED = "_orig_mod."  # what torch.compile's wrapper adds to every key
CLI_INSTANTIATOR = "lightning.pytorch.cli.instantiate_module"
SUFFIXES = {".pt2": "pt2", ".onnx": "onnx"}  # any other suffix: state_dict
# The splits an example batch is taken from, in order of preference, with the
# stage their DataModule is set up for.
EXAMPLE_SPLITS = (("predict", "predict"), ("test", "test"), ("val", "validate"), ("train", "fit"))
DATAMODULE_HPARAMS = "datamodule_hyper_parameters"


class ExportError(CheckpointError):
    """The checkpoint cannot be exported; the message says why and what would fix it."""


def clean_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Keys without the prefixes wrappers add: torch.compile's `_orig_mod.` anywhere,
    and DDP's `module.` when every key starts with it. Never a name a user chose.
    (torch's `consume_prefix_in_state_dict_if_present` strips a prefix from the keys
    that start with it: neither one mid-key nor only when every key has it.)"""
    cleaned = {key.replace(COMPILED, ""): value for key, value in state_dict.items()}
    if cleaned and all(key.startswith("module.") for key in cleaned):
        cleaned = {key.removeprefix("module."): value for key, value in cleaned.items()}
    return cleaned


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def module_class(path: str | None, project: Project) -> type:
    """The LightningModule class an export names: the project's model (the default),
    or another class of the project's package; never code from elsewhere."""
    model = project.model
    if not path or path == class_path(model):
        return model
    module_name, _, name = path.rpartition(".")
    package = project.package or model.__module__.partition(".")[0]
    if module_name != package and not module_name.startswith(package + "."):
        raise ExportError(
            f"the file names the class {path!r}, which is neither the project's model"
            f" ({class_path(model)}) nor part of {package}; only those are rebuilt"
        )
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as error:
        raise ExportError(
            f"the file names the class {path!r}, which {package} lacks: {error}"
        ) from error


def build_module(cls: type, hyper_parameters: dict[str, Any]) -> nn.Module:
    """A fresh LightningModule from the hyperparameters a checkpoint recorded."""
    hparams = dict(hyper_parameters)
    instantiator = hparams.pop("_instantiator", None)
    recorded_class = hparams.pop("_class_path", None)
    try:
        if instantiator == CLI_INSTANTIATOR:  # recorded by the Lightning CLI: parse it back
            from lightning.pytorch.cli import instantiate_module

            config = {"_class_path": recorded_class, **hparams} if recorded_class else hparams
            return cast(nn.Module, instantiate_module(cls, config))
        accepted = inspect.signature(cls).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
            return cls(**hparams)  # takes any argument: its **kwargs pass them on
        return cls(**{key: value for key, value in hparams.items() if key in accepted})
    except Exception as error:
        raise ExportError(
            f"cannot rebuild {cls.__name__} from the checkpoint's hyperparameters"
            f" ({', '.join(sorted(hparams)) or 'none recorded'}): {error}. Call"
            " self.save_hyperparameters() in its __init__, so checkpoints record its arguments"
        ) from error


def read_checkpoint(ckpt_path: str | Path) -> dict[str, Any]:
    """A Lightning checkpoint, checked and loaded the safe way (weights_only)."""
    path = check_checkpoint(ckpt_path)
    if path.is_dir():  # a sharded checkpoint (configs/fsdp.yaml): its shards joined
        path = consolidated(path)
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if "state_dict" not in checkpoint:
        raise ExportError(f"checkpoint '{ckpt_path}' has no state_dict: not from Lightning")
    return checkpoint


def load_checkpoint_module(
    ckpt_path: str | Path, project: Project, checkpoint: dict[str, Any] | None = None
) -> tuple[nn.Module, dict[str, Any]]:
    """The LightningModule of a checkpoint with its weights, in eval mode, and its
    hyperparameters: Lightning's `load_from_checkpoint`, tensors and plain values only.

    The class is the project's model, or the subclass of it that the Lightning CLI
    recorded (`_class_path`) when one of the project's package was trained.
    `checkpoint` is the file, when it has been read already.
    """
    path = check_checkpoint(ckpt_path)
    if path.is_dir():
        path = consolidated(path)
    if checkpoint is None:
        checkpoint = read_checkpoint(path)
    recorded = dict(checkpoint.get("hyper_parameters") or {}).get("_class_path")
    cls = module_class(recorded, project)
    if not (isinstance(cls, type) and issubclass(cls, project.model)):
        raise ExportError(
            f"checkpoint '{ckpt_path}' names the class {recorded!r}, which is not the"
            f" project's model ({class_path(project.model)}) or a subclass of it"
        )
    try:
        module = cls.load_from_checkpoint(path, map_location="cpu", weights_only=True)
    except RuntimeError as error:
        raise ExportError(
            f"checkpoint '{ckpt_path}': {state_dict_mismatch(error) or error} (a module that"
            " takes arguments must call self.save_hyperparameters(), so checkpoints record them)"
        ) from error
    except TypeError as error:
        raise ExportError(
            f"cannot rebuild {cls.__name__} from checkpoint '{ckpt_path}': {error}."
            " Call self.save_hyperparameters() in its __init__, so checkpoints record its"
            " arguments"
        ) from error
    except ValueError as error:
        raise ExportError(
            f"cannot rebuild {cls.__name__} from checkpoint '{ckpt_path}': {error}"
        ) from error
    return module.eval(), dict(module.hparams)


def format_of(output: str | Path, requested: str | None = None) -> str:
    """The format to write: `requested`, else the one the output's suffix names."""
    if requested is not None:
        if requested not in FORMATS:
            raise ExportError(f"unknown format {requested!r}: one of {', '.join(FORMATS)}")
        return requested
    if str(output).endswith(("/", os.sep)) or Path(output).is_dir():
        return "folder"
    return SUFFIXES.get(Path(output).suffix.lower(), "state_dict")


def export(
    ckpt_path: str | Path,
    output: str | Path,
    project: Project,
    format: str | None = None,
    rtol: float = RTOL,
    atol: float = ATOL,
) -> Path:
    """Write the network of a Lightning checkpoint to `output`; returns its path.

    `format` is one of FORMATS; by default the suffix of `output` picks it.
    """
    chosen = format_of(output, format)
    checkpoint = read_checkpoint(ckpt_path)
    module, hparams = load_checkpoint_module(ckpt_path, project, checkpoint)
    try:
        attribute, network = network_of(module, project.network)
    except ValueError as error:
        raise ExportError(str(error)) from error
    if chosen in ("state_dict", "folder"):
        exported = {
            "module": class_path(type(module)),
            "hyper_parameters": hparams,
            "attribute": attribute,
            "network": class_path(type(network)),
            "state_dict": clean_state_dict(network.state_dict()),
        }
        # Prove it loads before writing it: strict, into a network rebuilt from the record.
        rebuild(exported, project).load_state_dict(exported["state_dict"], strict=True)
        if chosen == "state_dict":
            return atomic_save(exported, output)
    batch, sizes = example_data(project, checkpoint.get(DATAMODULE_HPARAMS))
    inputs = at_least_two(network_inputs(batch, project.network_inputs))
    if chosen == "folder":
        path = check_checkpoint(ckpt_path)
        folder_record = {
            "format": folder.LAYOUT,
            **{key: value for key, value in exported.items() if key != "hyper_parameters"},
            "hyper_parameters": folder.as_json(hparams, "hyper_parameters"),
            "inputs": [{"shape": list(x.shape), "dtype": str(x.dtype)[6:]} for x in inputs],
            "dynamic_dims": {str(dim): name for dim, name in project.dims.items()},
        }
        parameters = sum(p.numel() for p in network.parameters())
        run = run_of_checkpoint(path)
        config = run / "config.yaml" if run and (run / "config.yaml").is_file() else None
        card = folder.model_card(
            folder_record, checkpoint, path, project, sizes, parameters, config is not None
        )

        def same_outputs(written: Path) -> None:
            with torch.no_grad():
                got = tensors_of(load_network(written, project)(*inputs))
                want = tensors_of(network.eval()(*inputs))
            compare("the folder's network", got, want, rtol, atol)

        return folder.write_folder(Path(output), folder_record, card, config, same_outputs)
    data = deployable(network.eval(), inputs, chosen, rtol=rtol, atol=atol, dims=project.dims)
    return atomic_save(data, output, save=write_bytes)


def write_bytes(data: bytes, file: Any) -> None:
    file.write(data)


def network_inputs(
    batch: Any, hook: Callable[[Any], Any] | None = None
) -> tuple[torch.Tensor, ...]:
    """What the network takes, from a batch as the module's steps receive it.

    The project's `network_inputs(batch)` when it names one; else the batch
    itself when it is a tensor, or its first element when it is a tuple or list.
    """
    if hook is not None:
        inputs = hook(batch)
        inputs = tuple(inputs) if isinstance(inputs, tuple | list) else (inputs,)
        source = f"Project.network_inputs ({getattr(hook, '__name__', hook)})"
    elif isinstance(batch, torch.Tensor):
        inputs, source = (batch,), "the batch"
    elif isinstance(batch, tuple | list) and batch and isinstance(batch[0], torch.Tensor):
        inputs, source = (batch[0],), "the batch's first element"
    else:
        kind = type(batch).__name__
        keys = f" with keys {sorted(map(str, batch))}" if isinstance(batch, dict) else ""
        raise ExportError(
            f"cannot tell the network's inputs from a batch of type {kind}{keys}: name a"
            " function `batch -> tuple` as Project.network_inputs in project.py, returning the"
            " tensors the network takes, in the order of its forward's arguments"
        )
    if not inputs or not all(isinstance(x, torch.Tensor) and x.dim() > 0 for x in inputs):
        raise ExportError(
            f"{source} must give tensors with a batch dimension, got"
            f" {[type(x).__name__ for x in inputs] or 'nothing'}"
        )
    sizes = {x.shape[0] for x in inputs}
    if len(sizes) != 1:
        raise ExportError(
            f"{source} gives tensors of different first dimensions ({sorted(sizes)}); the"
            " first dimension of every input is the batch"
        )
    return inputs


def at_least_two(inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The inputs with a batch of two or more: torch.export fixes a batch of one."""
    if inputs[0].shape[0] >= 2:
        return inputs
    return tuple(torch.cat([x] * 2) for x in inputs)


def example_data(
    project: Project, datamodule_hparams: dict[str, Any] | None = None
) -> tuple[Any, dict[str, int]]:
    """The first batch of the project's DataModule, on the CPU, and the number of
    samples of each split it defines (train, val, test).

    Built with the hyperparameters the checkpoint recorded for it, if any; the batch
    is taken from the first split it defines of predict, test, val and train.
    """
    from lightning.pytorch.utilities.model_helpers import is_overridden

    DataModule = project.datamodule  # noqa: N806  (a class)
    hparams = dict(datamodule_hparams or {})
    try:
        datamodule = build_module(DataModule, hparams)
        datamodule.prepare_data()
        loaders, sizes = {}, {}
        for split, stage in reversed(EXAMPLE_SPLITS):
            if is_overridden(f"{split}_dataloader", datamodule):
                datamodule.setup(stage)
                loaders[split] = getattr(datamodule, f"{split}_dataloader")()
                dataset = getattr(loaders[split], "dataset", None)
                if split != "predict" and hasattr(dataset, "__len__"):
                    sizes[split] = len(dataset)
        first = next((split for split, _ in EXAMPLE_SPLITS if split in loaders), None)
        if first is not None:
            return next(iter(loaders[first])), sizes
    except ExportError:
        raise
    except Exception as error:
        raise ExportError(
            f"cannot take an example batch from {DataModule.__name__}: {error}"
        ) from error
    raise ExportError(f"{DataModule.__name__} defines no dataloader to take an example batch from")


def reason(error: BaseException) -> str:
    """The message of a tracing error on one line, with the call that raised it.

    torch.export's messages can start with the code of the traced graph; the
    first line of prose is the reason.
    """
    lines = str(error).splitlines()
    prose = [
        line.strip()
        for line in lines
        if line.strip() and not line[:1].isspace() and not line.startswith(("def ", "#"))
    ]
    message = prose[0] if prose else type(error).__name__
    for before, line in pairwise(lines):
        if "raised this error" in before and line.strip().startswith("File "):
            return f"{message} ({line.strip()})"
    return message


def tensors_of(outputs: Any) -> list[torch.Tensor]:
    """Every tensor of a network's outputs (a tensor, tuple, list or dict), in order."""
    tensors: list[torch.Tensor] = []
    apply_to_collection(outputs, torch.Tensor, tensors.append)
    return tensors


def compare(
    name: str, actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], rtol, atol
) -> None:
    """ExportError unless `actual` equals `expected`, within the tolerance for floats."""
    if len(actual) != len(expected):
        raise ExportError(f"{name} gives {len(actual)} outputs, the network {len(expected)}")
    for index, (got, want) in enumerate(zip(actual, expected, strict=True)):
        got = got.to(want.device)
        if got.shape != want.shape:
            raise ExportError(
                f"{name}'s output {index} has shape {tuple(got.shape)}, the network's"
                f" {tuple(want.shape)}"
            )
        if want.is_floating_point() or want.is_complex():
            if not torch.allclose(got.to(want.dtype), want, rtol=rtol, atol=atol):
                worst = (got.to(want.dtype) - want).abs().max().item()
                raise ExportError(
                    f"{name}'s output {index} differs from the network's by up to {worst:.3g}"
                    f" (allowed: rtol={rtol}, atol={atol}; --rtol and --atol set them)"
                )
        elif not torch.equal(got.to(want.dtype), want):
            raise ExportError(f"{name}'s output {index} differs from the network's")


def deployable(
    network: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    format: str,
    rtol: float = RTOL,
    atol: float = ATOL,
    dims: Mapping[int, str] = BATCH_ONLY,
) -> bytes:
    """The bytes of the network as a `pt2` or `onnx` file, `dims` of every input free.

    Checked before they are returned: read back from the bytes, the export's
    outputs equal the network's on `inputs` and on a batch of another size.
    """
    # torch's tracers log what they skip, at WARNING: the one line an
    # ExportError gives is the message here.
    logging.disable(logging.WARNING)
    try:
        return checked_export(network, inputs, format, rtol, atol, dims)
    finally:
        logging.disable(logging.NOTSET)


def grown(inputs: tuple[torch.Tensor, ...], dims: Mapping[int, str]) -> tuple:
    """The inputs one longer along every free dimension (each input that has it), by
    repeating its first slice there: a second shape the export must take."""
    out = []
    for x in inputs:
        for dim in dims:
            if dim < x.dim():
                x = torch.cat([x, x.narrow(dim, 0, 1)], dim=dim)
        out.append(x)
    return tuple(out)


def shape_of(x: torch.Tensor) -> str:
    return "x".join(map(str, x.shape))


def checked_export(
    network: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    format: str,
    rtol: float,
    atol: float,
    dims: Mapping[int, str] = BATCH_ONLY,
) -> bytes:
    named = ", ".join(f"{name} (dim {dim})" for dim, name in sorted(dims.items()))
    other = grown(inputs, dims)  # one longer along every free dimension
    with torch.no_grad():
        # Run first: a network that caches tensors on its first call has them now.
        expected = [tensors_of(network(*inputs))]
        try:
            expected.append(tensors_of(network(*other)))
        except Exception as error:
            raise ExportError(
                f"{type(network).__name__} fails on inputs one longer along {named} (first"
                f" input {shape_of(other[0])}): {reason(error)}; Project.dynamic_dims may name"
                " only dimensions the network takes at any size"
            ) from error
    free = {dim: torch.export.Dim.AUTO for dim in dims}  # torch.export names each one
    dynamic_shapes = tuple({d: v for d, v in free.items() if d < x.dim()} for x in inputs)
    try:
        # On failure torch.export prints the graph it traced so far to stderr.
        with contextlib.redirect_stderr(io.StringIO()):
            program = torch.export.export(network, inputs, dynamic_shapes=dynamic_shapes)
    except Exception as error:
        raise ExportError(
            f"torch.export cannot trace {type(network).__name__} with {named} free: {reason(error)}"
        ) from error
    fixed = fixed_dims(program, dynamic_shapes, dims)
    if fixed:
        raise ExportError(
            f"torch.export cannot trace {type(network).__name__} with {named} free: its code"
            f" fixes {', '.join(fixed)}"
        )
    if format == "pt2":
        buffer = io.BytesIO()
        torch.export.save(program, buffer)
        data = buffer.getvalue()
        run = pt2_runner(data)
    else:
        data = onnx_bytes(program, len(inputs))
        run = onnx_runner(data)
    for batch, want in zip((inputs, other), expected, strict=True):
        name = f"the {format} export (first input {shape_of(batch[0])})"
        try:
            with torch.no_grad():
                got = run(batch)
        except Exception as error:
            raise ExportError(f"{name} fails: {reason(error)}") from error
        compare(name, got, want, rtol, atol)
    return data


def fixed_dims(
    program: Any, dynamic_shapes: tuple[dict[int, Any], ...], dims: Mapping[int, str]
) -> list[str]:
    """The free dimensions torch.export made constant (Dim.AUTO does so without a word
    when the code needs one size), as "length (dim 1) of input 0 to 6"."""
    from torch.fx.experimental.symbolic_shapes import is_concrete_int

    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    fixed = []
    for index, (name, free) in enumerate(
        zip(program.graph_signature.user_inputs, dynamic_shapes, strict=False)
    ):
        value = placeholders[name].meta.get("val") if name in placeholders else None
        if not isinstance(value, torch.Tensor):
            continue
        for dim in free:
            size = value.shape[dim]
            if is_concrete_int(size):
                fixed.append(f"{dims[dim]} (dim {dim}) of input {index} to {size}")
    return fixed


def pt2_runner(data: bytes) -> Callable[[tuple], list[torch.Tensor]]:
    """A function that runs `.pt2` bytes, loaded with torch.export.load, on a tuple of tensors."""
    program = torch.export.load(io.BytesIO(data)).module()

    def run(inputs: tuple) -> list[torch.Tensor]:
        return tensors_of(program(*inputs))

    return run


def onnx_modules() -> tuple[Any, Any]:
    """(onnx, onnxruntime), or ExportError saying how to install them."""
    try:
        import onnx
        import onnxruntime
        import onnxscript  # noqa: F401  (torch.onnx's exporter)
    except ImportError as error:
        raise ExportError(
            f"writing ONNX needs onnx, onnxscript and onnxruntime ({error.name} is missing):"
            ' pip install "onnx>=1.18" "onnxscript>=0.5" "onnxruntime>=1.22" (the [onnx] extra)'
        ) from error
    return onnx, onnxruntime


def onnx_bytes(program: Any, n_inputs: int) -> bytes:
    """An ExportedProgram as ONNX, its inputs named input_0, input_1, ..."""
    onnx, _ = onnx_modules()
    try:
        with warnings.catch_warnings():
            # Raised inside torch's own exporter by this torch release.
            warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated")
            onnx_program = torch.onnx.export(
                program, input_names=[f"input_{i}" for i in range(n_inputs)], verbose=False
            )
    except Exception as error:
        raise ExportError(f"torch.onnx cannot convert the network: {reason(error)}") from error
    if onnx_program is None:  # torch returns None only when given a file to write
        raise ExportError("torch.onnx returned no program")
    model = onnx_program.model_proto
    onnx.checker.check_model(model)
    return model.SerializeToString()


def onnx_runner(data: bytes) -> Callable[[tuple], list[torch.Tensor]]:
    """A function that runs ONNX bytes in ONNX Runtime (CPU) on a tuple of tensors."""
    _, onnxruntime = onnx_modules()
    session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    names = [node.name for node in session.get_inputs()]

    def run(inputs: tuple) -> list[torch.Tensor]:
        feed = {f"input_{i}": x.numpy() for i, x in enumerate(inputs)}
        return [torch.from_numpy(out) for out in session.run(None, {n: feed[n] for n in names})]

    return run


def rebuild(exported: dict[str, Any], project: Project) -> nn.Module:
    """A fresh, untrained network of the kind `exported` holds."""
    cls = module_class(exported["module"], project)
    module = build_module(cls, exported["hyper_parameters"])
    network: Any = module
    for part in filter(None, exported["attribute"].split(".")):
        network = getattr(network, part)
    return uncompiled(network)


def load_network(path: str | Path, project: Project) -> nn.Module:
    """The network `export` wrote (a state_dict file or a model folder), rebuilt and
    loaded strictly, in eval mode."""
    if Path(path).is_dir():
        exported = folder.read_config(Path(path))
        state_dict = folder.read_weights(Path(path))
    else:
        exported = torch.load(path, map_location="cpu", weights_only=True)
        state_dict = exported["state_dict"]
    network = rebuild(exported, project)
    network.load_state_dict(state_dict, strict=True)
    return network.eval()


def main(argv: list[str] | None, project: Project) -> int:
    command_line = parser(project.command)
    args = command_line.parse_args(argv)
    if args.rtol < 0 or args.atol < 0:
        command_line.error("--rtol and --atol must be 0 or more")
    try:
        output = export(
            args.ckpt_path, args.output, project, args.format, rtol=args.rtol, atol=args.atol
        )
    except (CheckpointError, CheckpointSaveError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    chosen = format_of(output, args.format)
    if chosen in ("state_dict", "folder"):
        use = f"load it with {project.package}.kit.export.load_network({str(output)!r}, PROJECT)"
        if chosen == "folder":
            use += f"; `hf upload <user>/<name> {output}` shares it on the Hugging Face Hub"
    elif chosen == "pt2":
        use = f"torch.export.load({str(output)!r}).module() runs it, with torch alone"
    else:
        use = f"onnxruntime.InferenceSession({str(output)!r}) runs it"
    print(f"Wrote {output} ({chosen}): {use}")
    return 0
