"""What the kit may ask of your code: one `Project`, made in project.py and passed in.

The kit imports nothing of yours. `__main__` hands it the `Project` that
project.py builds; every command, callback and test reads your model, your
data and your metric from there, and nowhere else. Each field has a default;
a model and a DataModule are all a project must give.
"""

import importlib.metadata
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # torch is imported where a network is looked for, not with the spec
    from torch import nn

# The dynamic dimensions of an export when the project names none: the first
# (the batch) of every input.
BATCH_ONLY: Mapping[int, str] = {0: "batch"}


class ConfigError(ValueError):
    """A value that the project, a config or a flag gives and the kit refuses; the message
    names the value and the rule (the command prints it in one line, exit code 2)."""


@dataclass(frozen=True)
class Project:
    """Everything the kit may ask of a project, each with its default."""

    model: type
    """The LightningModule class that `fit` trains (its __init__ arguments are `--model.*`)."""

    datamodule: type
    """The LightningDataModule class that feeds it (its __init__ arguments are `--data.*`)."""

    monitor: str = "val/loss"
    """The metric, logged in `validation_step`, that picks the best checkpoint and that a
    sweep optimises."""

    mode: Literal["min", "max"] = "min"
    """Which way `monitor` is better."""

    network: str | None = None
    """The attribute of the LightningModule that holds the network `export` writes
    ("net", "model.encoder", "generator"). None: its only child module with weights,
    else the whole module."""

    network_inputs: Callable[[Any], tuple] | None = None
    """What the network takes, from one batch (a module-level function, so that it
    pickles). None: the batch itself when it is a tensor, else its first element."""

    dynamic_dims: Mapping[int, str] | None = None
    """The dimensions an export leaves free, the same for every input, by position:
    `{0: "batch", 1: "length"}` for sequences. None: the batch alone."""

    wrap: tuple[str, ...] | None = None
    """What FSDP (configs/fsdp.yaml) shards and `--compile.enabled` compiles, each on its
    own: attributes of the LightningModule ("generator", "discriminator"); together they
    hold every weight. None: each of its children with weights."""

    shard_blocks: tuple[str, ...] | None = None
    """What FSDP shards one by one inside those: class names ("TransformerBlock") or module
    paths ("layers.*", from the module that holds them). None: every block they repeat."""

    prediction_columns: Callable[[Any], Mapping[str, Any]] | None = None
    """`predict`'s CSV columns, from one batch of `predict_step` outputs. None: the
    kit's (a class per row for 2-D scores, the values themselves otherwise)."""

    defaults: Path | None = None
    """The config file every command reads first; the command line and `--config` files
    override it. None: configs/default.yaml of the project's checkout, if there is one."""

    package: str = field(default="")
    """The Python package the command runs (`python -m package`); `__main__` sets it."""

    command: str = field(default="")
    """The console command, for messages; found from the package when left empty."""

    def __post_init__(self) -> None:
        if self.mode not in ("min", "max"):
            raise ValueError(f"Project.mode={self.mode!r}: expected 'min' or 'max'")
        if not self.monitor:
            raise ValueError("Project.monitor is empty: name a metric validation_step logs")

    def bound(self, package: str) -> "Project":
        """This project as `package`'s command runs it: its package, command and
        defaults filled in where project.py left them out."""
        defaults = self.defaults
        if defaults is None:
            found = checkout_of(package) / "configs" / "default.yaml"
            defaults = found if found.is_file() else None
        return replace(
            self, package=package, command=self.command or command_of(package), defaults=defaults
        )

    @property
    def dims(self) -> Mapping[int, str]:
        """`dynamic_dims`, or the batch alone."""
        return self.dynamic_dims if self.dynamic_dims is not None else BATCH_ONLY


def units_of(module: "nn.Module", wrap: Sequence[str] | None = None) -> list["nn.Module"]:
    """The submodules FSDP shards and compile compiles, each on its own (`Project.wrap`):
    the attributes it names, else each child with weights."""
    if wrap:
        return [submodule(module, attribute, "wrap") for attribute in wrap]
    return [child for child in module.children() if any(True for _ in child.parameters())]


def submodule(module: "nn.Module", attribute: str, field: str) -> "nn.Module":
    """The submodule at `attribute` ("model.encoder"), which `Project.<field>` names; a
    ConfigError lists the module's own submodules when there is none there."""
    from torch import nn

    found: Any = module
    for part in attribute.split("."):
        found = getattr(found, part, None)
    if not isinstance(found, nn.Module):
        children = ", ".join(name for name, _ in module.named_children()) or "none"
        raise ConfigError(
            f"Project.{field}={attribute!r} is not a submodule of {type(module).__name__}"
            f" (its submodules: {children})"
        )
    return found


def command_of(package: str) -> str:
    """The console script that runs `package`'s `__main__`, from the installed metadata;
    else `python -m package`."""
    target = f"{package}.__main__"
    for entry in importlib.metadata.entry_points(group="console_scripts"):
        if entry.module == target:
            return entry.name
    return f"python -m {package}"


@dataclass
class FSDPOptions:
    """`--fsdp.*`: fully shard the network over the data-parallel ranks (FSDP2).

    Args:
        enabled: shard parameters, gradients and optimizer state (configs/fsdp.yaml
            sets it).
        blocks: what to shard one by one: class names or module paths ("layers.*").
            None: the project's `shard_blocks`, else every repeated block.
        activation_checkpointing: recompute each block's activations in the backward
            pass: less memory, about a third more compute.
        cpu_offload: keep the sharded state in host memory between uses (CUDA only).
        reshard_after_forward: free each block's gathered parameters after its forward
            (ZeRO-3); false keeps them until the backward (ZeRO-2: faster, more memory).
        data_parallel_size: the ranks that shard the model; null: every rank.
        tensor_parallel_size: must be 1: tensor parallelism needs a configure_model of
            your own.
    """

    enabled: bool = False
    blocks: list[str] | None = None
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    reshard_after_forward: bool = True
    data_parallel_size: int | None = None
    tensor_parallel_size: int = 1


def init_parameters(cls: type) -> set[str]:
    """The arguments a class takes as the CLI reads them: its `__init__`'s, and its bases'
    that a `**kwargs` passes on (jsonargparse follows it)."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_class_arguments(cls, "init")
    return {key.partition(".")[2] for key in parser.get_defaults().keys()}


def checkout_of(package: str) -> Path:
    """The folder the package's source sits in, two levels up (`src/<package>/`)."""
    spec = importlib.util.find_spec(package)
    origin = Path(spec.origin if spec and spec.origin else ".").resolve()
    return origin.parents[2] if len(origin.parents) > 2 else Path.cwd()


def network_of(module: "nn.Module", attribute: str | None = None) -> tuple[str, "nn.Module"]:
    """(attribute, network): the submodule the project names (`Project.network`), else
    the module's only child with weights ("" and the module itself when there are
    several). torch.compile's wrapper is looked through."""
    from .internals import uncompiled  # (imports Lightning: not before a fit needs it)

    if attribute:
        return attribute, uncompiled(submodule(module, attribute, "network"))
    weighted = [
        (name, child)
        for name, child in module.named_children()
        if any(True for _ in child.parameters())
    ]
    if len(weighted) == 1:
        name, child = weighted[0]
        return name, uncompiled(child)
    return "", module
