"""`{{ cookiecutter.project_slug }} export`: the trained network alone, for use without Lightning.

    {{ cookiecutter.project_slug }} export --ckpt_path logs/.../best-....ckpt --output model.pt

writes a plain file that `torch.load(..., weights_only=True)` reads:
a dict with "network" (the class, as "<module>.<class>"), "hyper_parameters"
and "state_dict".
The state_dict is the inner network's own: no `net.` of the LightningModule,
no `module.` of DDP/DataParallel, no `_orig_mod.` of torch.compile, so it loads
with `strict=True` into a freshly built network:

    from {{ cookiecutter.package_name }}.export import load_network
    network = load_network("model.pt")   # an nn.Module in eval mode
"""

import argparse
import importlib
import inspect
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from {{ cookiecutter.package_name }}.checkpoints import CheckpointError, check_checkpoint

# The LightningModule keeps its network in `self.net`.
NETWORK_ATTRIBUTE = "net"
WRAPPER_PREFIXES = ("model.", "module.", "_orig_mod.")


def _strip_wrappers(key: str) -> str:
    while key.startswith(WRAPPER_PREFIXES):
        key = key.split(".", 1)[1]
    return key


def network_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inner network's entries of a LightningModule state_dict, every wrapper prefix removed."""
    inner = {}
    for key, value in state_dict.items():
        key = _strip_wrappers(key)
        if key.startswith(NETWORK_ATTRIBUTE + "."):
            inner[_strip_wrappers(key.removeprefix(NETWORK_ATTRIBUTE + "."))] = value
    return inner


def network_class() -> type[nn.Module]:
    """The class of the network the project's LightningModule builds."""
    from {{ cookiecutter.package_name }}.cli import Model

    return type(getattr(Model(), NETWORK_ATTRIBUTE))


def build_network(class_path: str, hyper_parameters: dict[str, Any]) -> nn.Module:
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)(**hyper_parameters)


def export(ckpt_path: str | Path, output: str | Path) -> Path:
    """Write the network of a Lightning checkpoint to `output`; returns its path."""
    checkpoint = torch.load(check_checkpoint(ckpt_path), map_location="cpu", weights_only=True)
    if "state_dict" not in checkpoint:
        raise CheckpointError(f"checkpoint '{ckpt_path}' has no state_dict: not from Lightning")
    cls = network_class()
    accepted = inspect.signature(cls).parameters
    hparams = {k: v for k, v in checkpoint.get("hyper_parameters", {}).items() if k in accepted}
    state_dict = network_state_dict(checkpoint["state_dict"])
    class_path = f"{cls.__module__}.{cls.__qualname__}"
    # Prove it loads before writing it: strict, into a network built from the hyperparameters.
    build_network(class_path, hparams).load_state_dict(state_dict, strict=True)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    exported = {"network": class_path, "hyper_parameters": hparams, "state_dict": state_dict}
    torch.save(exported, output)
    return output


def load_network(path: str | Path) -> nn.Module:
    """The network `export` wrote, rebuilt and loaded strictly, in eval mode."""
    exported = torch.load(path, map_location="cpu", weights_only=True)
    network = build_network(exported["network"], exported["hyper_parameters"])
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
    except CheckpointError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"Wrote {output}: load it with {{ cookiecutter.package_name }}.export.load_network({str(output)!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
