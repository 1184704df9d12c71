"""The model folder `export --output DIR/` writes, in the layout the Hugging Face Hub
shares models in (`hf upload <user>/<name> DIR` uploads it as it is):

- `model.safetensors`: the network's weights, read without pickle;
- `config.json`: what rebuilds the network (the LightningModule's class and its
  arguments, which of its submodules is the network), its inputs' shapes and
  dtypes, and the dimensions an export leaves free;
- `README.md`: the model card, with the run's own figures (the best monitored
  value and its epoch, the test metrics where `test` ran on this checkpoint, the
  data and its sizes, the hardware, precision, steps and time, the config that
  trains it again) and the sections only its authors can write, marked as such;
- `training_config.yaml`: the run's config, when the checkpoint sits in its run.

`kit.export.load_network(DIR, PROJECT)` rebuilds the network from the first two.
"""

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from .checkpoints import CheckpointError
from .resume import saved_state
from .runs import TEST_METRICS, run_of_checkpoint

WEIGHTS, CONFIG, CARD, TRAINING_CONFIG = (
    "model.safetensors",
    "config.json",
    "README.md",
    "training_config.yaml",
)
LAYOUT = "lightning-kit model folder 1"  # config.json's "format": what load_network reads
# The Hub's license identifiers for the ones a project may declare.
HUB_LICENSES = {"MIT": "mit", "Apache-2.0": "apache-2.0", "BSD-3-Clause": "bsd-3-clause"}
TO_WRITE = "_Not written yet._"


class FolderError(CheckpointError):
    """The folder cannot be written or read; the message says why."""


def safetensors_module() -> Any:
    try:
        import safetensors.torch
    except ImportError as error:
        raise FolderError(
            "a model folder needs safetensors: pip install 'safetensors>=0.4'"
        ) from error
    return safetensors.torch


def as_json(value: Any, where: str) -> Any:
    """`value` as JSON takes it (tuples as lists), or FolderError naming `where`."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [as_json(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, Mapping) and all(isinstance(key, str) for key in value):
        return {key: as_json(item, f"{where}.{key}") for key, item in value.items()}
    raise FolderError(
        f"{where} is a {type(value).__name__}, which config.json cannot hold; give the"
        " module's __init__ plain values (numbers, strings, lists, dicts) to export a folder"
    )


def unshared(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors, a copy of each one that shares memory with an earlier
    one (tied weights): safetensors stores each tensor once and refuses shared ones."""
    seen: set[int] = set()
    tensors = {}
    for key, value in state_dict.items():
        tensor = value.detach().cpu().contiguous()
        pointer = tensor.untyped_storage().data_ptr()
        if pointer in seen:
            tensor = tensor.clone()
        seen.add(tensor.untyped_storage().data_ptr())
        tensors[key] = tensor
    return tensors


def read_config(folder: Path) -> dict[str, Any]:
    """config.json of a model folder, checked to be one."""
    path = folder / CONFIG
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise FolderError(
            f"'{folder}' is not a model folder: cannot read {CONFIG} ({error})"
        ) from error
    if not isinstance(config, dict) or config.get("format") != LAYOUT:
        raise FolderError(f"'{folder}' is not a model folder: its {CONFIG} is not {LAYOUT!r}")
    return config


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    try:
        return safetensors_module().load_file(str(folder / WEIGHTS), device="cpu")
    except (OSError, ValueError, RuntimeError) as error:
        raise FolderError(f"cannot read {folder / WEIGHTS}: {error}") from error


def write_folder(
    output: Path,
    record: dict[str, Any],
    card: str,
    config_yaml: Path | None,
    check: Callable[[Path], None],
) -> Path:
    """The folder, written beside `output`, read back by `check`, and renamed into place
    when whole; an earlier model folder there is replaced, anything else is refused."""
    output = Path(output)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        try:
            read_config(output)
        except FolderError:
            raise FolderError(
                f"'{output}' exists and is not a model folder: give --output a new folder"
            ) from None
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}-", dir=output.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)  # a folder as mkdir makes it (mkdtemp's is private)
        weights = unshared(record["state_dict"])
        safetensors_module().save_file(weights, str(staging / WEIGHTS), metadata={"format": "pt"})
        config = {key: value for key, value in record.items() if key != "state_dict"}
        (staging / CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        (staging / CARD).write_text(card, encoding="utf-8")
        if config_yaml is not None:
            shutil.copyfile(config_yaml, staging / TRAINING_CONFIG)
        for file in staging.iterdir():
            file.chmod(0o666 & ~umask)
        check(staging)
        if output.exists():
            old = output.with_name(f".{output.name}.replaced")
            shutil.rmtree(old, ignore_errors=True)
            output.rename(old)
            staging.rename(output)
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return output


def best_of(checkpoint: Mapping[str, Any]) -> dict[str, Any] | None:
    """The checkpoint callback's record: the monitored metric, its best value and epoch."""
    for state in (checkpoint.get("callbacks") or {}).values():
        if isinstance(state, Mapping) and "best_model_score" in state:
            return dict(state)
    return None


def tested_metrics(ckpt_path: Path) -> dict[str, float] | None:
    """What `test --ckpt_path` measured on this checkpoint file, if it ran."""
    run = run_of_checkpoint(ckpt_path)
    if run is None or not (run / TEST_METRICS).is_file():
        return None
    try:
        found = json.loads((run / TEST_METRICS).read_text(encoding="utf-8"))
    except ValueError:
        return None
    return found.get(ckpt_path.name) if isinstance(found, dict) else None


def license_of(package: str) -> str | None:
    """The license the project's pyproject.toml declares, if any."""
    import importlib.metadata

    try:
        metadata = importlib.metadata.metadata(package.replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:
        from .spec import checkout_of

        pyproject = checkout_of(package) / "pyproject.toml"
        if sys.version_info < (3, 11) or not pyproject.is_file():
            return None
        import tomllib

        license = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"].get("license")
        return license if isinstance(license, str) else None
    return metadata.get("License-Expression") or metadata.get("License")


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}{'es' if noun[-1] == 's' else 's'}"


def figure(value: Any) -> str:
    return f"{float(value):.4g}" if isinstance(value, float | torch.Tensor) else str(value)


def model_card(
    record: Mapping[str, Any],
    checkpoint: Mapping[str, Any],
    ckpt_path: Path,
    project: Any,
    sizes: Mapping[str, int],
    parameters: int,
    has_config: bool,
) -> str:
    """README.md of the folder: the Hub's metadata, the run's figures, and the sections
    only the model's authors can write, marked as such."""
    command, package = project.command, project.package
    license = license_of(package)
    front = ["---", "library_name: pytorch", "tags:", "- lightning", f"- {package}"]
    if license:
        front.append(f"license: {HUB_LICENSES.get(license, 'other')}")
    front.append("---")
    network, module = record["network"].rpartition(".")[2], record["module"].rpartition(".")[2]
    where = f"`{record['attribute']}` of `{module}`" if record["attribute"] else f"`{module}`"
    lines = [
        *front,
        "",
        f"# {network}",
        "",
        f"The network {where} ({parameters:,} parameters), trained with PyTorch Lightning by"
        f" the `{command}` project.",
        "",
        "## Results",
        "",
        "| | |",
        "| --- | --- |",
    ]
    best = best_of(checkpoint)
    if best and best.get("best_model_score") is not None:
        epoch = f", at epoch {best['best_epoch']}" if best.get("best_epoch") is not None else ""
        lines.append(
            f"| best {best.get('monitor')} ({project.mode}) | {figure(best['best_model_score'])}"
            f"{epoch} |"
        )
    lines.append(
        f"| this checkpoint | `{ckpt_path.name}`: epoch {checkpoint.get('epoch')}, step"
        f" {checkpoint.get('global_step')} |"
    )
    tested = tested_metrics(ckpt_path)
    if tested:
        lines += [f"| {name} | {figure(value)} |" for name, value in sorted(tested.items())]
    else:
        lines.append(
            f"| test | not run on this checkpoint (`{command} test --ckpt_path"
            f" {ckpt_path.name}` records it for the next export) |"
        )
    resume = saved_state(checkpoint, "ResumeState") or {}
    health = saved_state(checkpoint, "TrainingHealth") or {}
    data = ", ".join(f"{n:,} {split}" for split, n in sizes.items()) or "sizes unknown"
    lines += ["", "## Training", "", "| | |", "| --- | --- |"]
    lines.append(f"| data | `{project.datamodule.__name__}`: {data} samples |")
    if resume:
        world = resume.get("world_size", 1)
        device = resume.get("device") or resume.get("accelerator")
        lines += [
            f"| hardware | {plural(world, 'process')} on {device} |",
            f"| precision | {resume.get('precision')} |",
            f"| batch | {resume.get('batch_size')} samples a process, gradients accumulated over"
            f" {plural(resume.get('accumulate', 1), 'step')} |",
        ]
    if health.get("steps"):
        seconds = float(health.get("wait", 0)) + float(health.get("compute", 0))
        lines.append(f"| steps | {health['steps']:,}, {seconds:.1f} s in training steps |")
    lines.append(
        f"| versions | torch {torch.__version__.split('+')[0]}, lightning"
        f" {checkpoint.get('pytorch-lightning_version')} |"
    )
    lines.append("")
    if has_config:
        lines += [
            f"To train it again: `{command} fit --config {TRAINING_CONFIG}` (the run's config,"
            " in this folder).",
            "",
        ]
    lines += [
        "## Use",
        "",
        "```python",
        f"from {package}.kit.export import load_network",
        f"from {package}.project import PROJECT",
        "",
        'network = load_network("path/to/this/folder", PROJECT)  # eval mode, no pickle',
        "```",
        "",
        f"Without the project: `{WEIGHTS}` holds the network's `state_dict`"
        f" (`safetensors.torch.load_file`), and `{CONFIG}` names its class, its arguments and"
        " its inputs.",
        "",
        "To share it on the Hugging Face Hub: `hf upload <user>/<name> path/to/this/folder`.",
        "",
        "## To be written by the model's authors",
        "",
        "### Intended use",
        "",
        f"{TO_WRITE} What the model is for, and what it must not be used for.",
        "",
        "### Training data",
        "",
        f"{TO_WRITE} Where the data comes from, its license, and what it leaves out.",
        "",
        "### Limitations and risks",
        "",
        f"{TO_WRITE} Where the model fails, and who its mistakes could harm.",
        "",
        "## License",
        "",
        f"{license} (the project's license)." if license else f"{TO_WRITE} No license declared.",
        "",
    ]
    return "\n".join(lines)
