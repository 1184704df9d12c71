"""The configured model and data, batches of it, and a clock tests move by hand."""

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch.utils._pytree import tree_flatten

from .project import main


def configured(*flags: str):
    """The CLI as `fit` would build it, without running: `.model`, `.datamodule`, `.trainer`."""
    return main(["--trainer.logger=false", *flags], run=False)


def loader_of(cli, split: str):
    """The configured DataModule's `split` loader; its first, where it gives several (a
    list or a dict of validation loaders)."""
    datamodule = cli.datamodule
    datamodule.trainer = cli.trainer
    datamodule.prepare_data()
    datamodule.setup("fit" if split in ("train", "val") else split)
    loaders = getattr(datamodule, f"{split}_dataloader")()
    if isinstance(loaders, dict):
        return next(iter(loaders.values()))
    return loaders[0] if isinstance(loaders, list | tuple) else loaders


def first_batch(cli, split: str = "train", device: str | torch.device = "cpu"):
    """One batch of the configured DataModule, as the module's steps receive it."""
    return move_data_to_device(next(iter(loader_of(cli, split))), torch.device(device))


def same_values(a, b) -> bool:
    """Whether two batches or outputs (tensors, tuples, dicts, lists) hold equal values."""
    flat_a, spec_a = tree_flatten(a)
    flat_b, spec_b = tree_flatten(b)
    return spec_a == spec_b and all(
        torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
        for x, y in zip(flat_a, flat_b, strict=True)
    )


def loader_length(cli, split: str) -> int:
    """How many samples the configured DataModule's `split` loader holds (its first)."""
    return len(loader_of(cli, split).dataset)


class FakeClock:
    """A clock that moves only when a test says so: timing logic gets exact numbers,
    whatever the machine's speed. Each process has its own copy (loader workers too)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
