"""`{{ cookiecutter.project_slug }} export`: the trained network of a checkpoint, as a plain file.

    {{ cookiecutter.project_slug }} export --ckpt_path logs/version_0/checkpoints/last.ckpt --output model.pt

writes what `torch.load(..., weights_only=True)` reads: the network's own
`state_dict` (no `_orig_mod.` of torch.compile, no prefix of the LightningModule),
with what rebuilds it: the LightningModule's class and hyperparameters, and
which of its submodules is the network. Load it back with

    from {{ cookiecutter.package_name }}.kit.export import load_network
    network = load_network("model.pt")   # an nn.Module in eval mode

Which submodule is the network: the one the LightningModule names in a
`network_attribute` class attribute ("net", "model.encoder"); else its only
child module with weights; else the whole LightningModule.
"""

import argparse
import importlib
import inspect
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from {{ cookiecutter.package_name }}.kit.checkpoints import (
    CheckpointError,
    CheckpointSaveError,
    atomic_save,
    check_checkpoint,
    state_dict_mismatch,
)

PACKAGE = "{{ cookiecutter.package_name }}"
COMPILED = "_orig_mod."  # what torch.compile's wrapper adds to every key
CLI_INSTANTIATOR = "lightning.pytorch.cli.instantiate_module"


class ExportError(CheckpointError):
    """The checkpoint cannot be exported; the message says why and what would fix it."""


def clean_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Keys without the prefixes wrappers add: torch.compile's `_orig_mod.` anywhere,
    and DDP's `module.` when every key starts with it. Never a name a user chose."""
    cleaned = {key.replace(COMPILED, ""): value for key, value in state_dict.items()}
    if cleaned and all(key.startswith("module.") for key in cleaned):
        cleaned = {key.removeprefix("module."): value for key, value in cleaned.items()}
    return cleaned


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def module_class(path: str | None) -> type:
    """The LightningModule class a checkpoint or an export names: project.Model (the
    default), or another class of this project; never code from elsewhere."""
    from {{ cookiecutter.package_name }}.project import Model

    if not path or path == class_path(Model):
        return Model
    module_name, _, name = path.rpartition(".")
    if module_name != PACKAGE and not module_name.startswith(PACKAGE + "."):
        raise ExportError(
            f"the file names the class {path!r}, which is neither project.Model"
            f" ({class_path(Model)}) nor part of {PACKAGE}; only those are rebuilt"
        )
    return getattr(importlib.import_module(module_name), name)


def build_module(cls: type, hyper_parameters: dict[str, Any]) -> nn.Module:
    """A fresh LightningModule from the hyperparameters a checkpoint recorded."""
    hparams = dict(hyper_parameters)
    instantiator = hparams.pop("_instantiator", None)
    recorded_class = hparams.pop("_class_path", None)
    try:
        if instantiator == CLI_INSTANTIATOR:  # recorded by the Lightning CLI: parse it back
            from lightning.pytorch.cli import instantiate_module

            config = {"_class_path": recorded_class, **hparams} if recorded_class else hparams
            return instantiate_module(cls, config)
        accepted = inspect.signature(cls).parameters
        return cls(**{key: value for key, value in hparams.items() if key in accepted})
    except Exception as error:
        raise ExportError(
            f"cannot rebuild {cls.__name__} from the checkpoint's hyperparameters"
            f" ({', '.join(sorted(hparams)) or 'none recorded'}): {error}. Call"
            " self.save_hyperparameters() in its __init__, so checkpoints record its arguments"
        ) from error


def network_of(module: nn.Module) -> tuple[str, nn.Module]:
    """(attribute, network): the submodule to export, see the module docstring."""
    declared = getattr(type(module), "network_attribute", None)
    if declared:
        network: Any = module
        for part in declared.split("."):
            network = getattr(network, part, None)
        if not isinstance(network, nn.Module):
            children = ", ".join(name for name, _ in module.named_children()) or "none"
            raise ExportError(
                f"{type(module).__name__}.network_attribute = {declared!r}, but that is not a"
                f" submodule of it (its submodules: {children})"
            )
        return declared, getattr(network, "_orig_mod", network)
    weighted = [
        (name, child)
        for name, child in module.named_children()
        if any(True for _ in child.parameters())
    ]
    if len(weighted) == 1:
        name, child = weighted[0]
        return name, getattr(child, "_orig_mod", child)
    return "", module


def load_checkpoint_module(ckpt_path: str | Path) -> tuple[nn.Module, dict[str, Any]]:
    """The LightningModule of a checkpoint with its weights, and its hyperparameters."""
    checkpoint = torch.load(check_checkpoint(ckpt_path), map_location="cpu", weights_only=True)
    if "state_dict" not in checkpoint:
        raise ExportError(f"checkpoint '{ckpt_path}' has no state_dict: not from Lightning")
    hparams = dict(checkpoint.get("hyper_parameters") or {})
    module = build_module(module_class(hparams.get("_class_path")), hparams)
    try:
        module.load_state_dict(clean_state_dict(checkpoint["state_dict"]), strict=True)
    except RuntimeError as error:
        raise ExportError(
            f"checkpoint '{ckpt_path}': {state_dict_mismatch(error) or error} (as rebuilt from"
            f" its recorded hyperparameters: {', '.join(sorted(hparams)) or 'none'}; a module"
            " that takes arguments must call self.save_hyperparameters())"
        ) from error
    return module.eval(), hparams


def export(ckpt_path: str | Path, output: str | Path) -> Path:
    """Write the network of a Lightning checkpoint to `output`; returns its path."""
    module, hparams = load_checkpoint_module(ckpt_path)
    attribute, network = network_of(module)
    exported = {
        "module": class_path(type(module)),
        "hyper_parameters": hparams,
        "attribute": attribute,
        "network": class_path(type(network)),
        "state_dict": clean_state_dict(network.state_dict()),
    }
    # Prove it loads before writing it: strict, into a network rebuilt from the record.
    rebuild(exported).load_state_dict(exported["state_dict"], strict=True)
    return atomic_save(exported, output)


def rebuild(exported: dict[str, Any]) -> nn.Module:
    """A fresh, untrained network of the kind `exported` holds."""
    module = build_module(module_class(exported["module"]), exported["hyper_parameters"])
    network: Any = module
    for part in filter(None, exported["attribute"].split(".")):
        network = getattr(network, part)
    return getattr(network, "_orig_mod", network)


def load_network(path: str | Path) -> nn.Module:
    """The network `export` wrote, rebuilt and loaded strictly, in eval mode."""
    exported = torch.load(path, map_location="cpu", weights_only=True)
    network = rebuild(exported)
    network.load_state_dict(exported["state_dict"], strict=True)
    return network.eval()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="{{ cookiecutter.project_slug }} export",
        description="Write the trained network of a checkpoint as a plain state_dict.",
    )
    parser.add_argument("--ckpt_path", required=True, help="a Lightning checkpoint (.ckpt)")
    parser.add_argument("--output", default="model.pt", help="where to write (default: model.pt)")
    args = parser.parse_args(argv)
    try:
        output = export(args.ckpt_path, args.output)
    except (CheckpointError, CheckpointSaveError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"Wrote {output}: load it with {PACKAGE}.kit.export.load_network({str(output)!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
