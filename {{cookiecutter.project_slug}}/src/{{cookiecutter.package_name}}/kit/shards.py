"""Under DDP and FSDP every rank trains its own share of the data, or the run stops.

Lightning gives each rank its share of a map-style dataset with a
DistributedSampler. Two kinds of data slip past it:

- a batch sampler of yours, which Lightning rebuilds around its DistributedSampler,
  passed as the first argument: right only where the batch sampler reads its
  indices from a sampler. One built from a list of lengths takes the sampler for
  the lengths, and every rank trains the same few batches, half the data or
  less, with exit code 0;
- a stream (an IterableDataset), which must split itself among the ranks: one
  that does not gives every rank the same batches.

`ShardCheck` looks at each loader once as the fit starts (the training loaders,
then the validation ones) and stops the run in one line that names the way out,
on every rank together. Imports Lightning, torch and the kit's callbacks, draws,
internals and spec.
"""

import copy
import random
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning_utilities import apply_to_collection
from torch.utils.data import BatchSampler, DistributedSampler, IterableDataset

from .callbacks import train_loaders
from .draws import global_generators_kept
from .internals import lightning_shards
from .spec import ConfigError

WAY_OUT = (
    "build that DataLoader as kit.data.ResumableLoader(dataset, batch_sampler=...), which"
    " deals your batches out to the processes, or split them by rank yourself and set"
    " --trainer.use_distributed_sampler false"
)


def as_list(loaders: Any) -> list[Any]:
    """The loaders of a split however they were given: one, a list or a dict."""
    if loaders is None:
        return []
    if isinstance(loaders, dict):
        return list(loaders.values())
    return list(loaders) if isinstance(loaders, list | tuple) else [loaders]


def held_samplers(holder: Any, depth: int = 2) -> list[DistributedSampler]:
    """The DistributedSamplers among `holder`'s attributes, and their attributes' (a batch
    sampler that wraps another), `depth` levels down."""
    found = []
    for value in vars(holder).values() if hasattr(holder, "__dict__") else ():
        if isinstance(value, DistributedSampler):
            found.append(value)
        elif depth > 1 and not isinstance(value, torch.Tensor):
            found += held_samplers(value, depth - 1)
    return found


def detached(batches: Any) -> Any:
    """A copy of a batch sampler to iterate without moving it: what it holds shared (a
    sampler, a dataset), its own random generators copied."""
    copied = copy.copy(batches)
    for name, value in vars(batches).items():
        if isinstance(value, torch.Generator | random.Random | np.random.Generator):
            setattr(copied, name, copy.deepcopy(value))
    return copied


def misread_batch_sampler(loader: Any) -> str | None:
    """Why the batch sampler of yours that Lightning rebuilt for this rank around its
    DistributedSampler (`lightning_shards` says it did) may not give this rank its share;
    None where it does."""
    batches = getattr(loader, "batch_sampler", None)
    if batches is None or type(batches) is BatchSampler:
        return None
    if isinstance(getattr(loader, "sampler", None), DistributedSampler):
        return None  # the batches are dealt out already (kit.data.RankBatches)
    name = type(batches).__name__
    given = held_samplers(batches)
    if not given:  # it made something else of it (a list of its indices, say)
        return f"the kit cannot see where {name} keeps it"
    # A DistributedSampler draws from a generator of its own: reading it moves nothing.
    with global_generators_kept(True):
        read = {index for batch in detached(batches) for index in batch}
    share = set(given[0])
    if read <= share and read:
        return None
    strays = len(read - share)
    return f"{name} does not read its batches from it ({strays} of its indices are not this rank's)"


def fingerprint(batch: Any) -> torch.Tensor:
    """A number that two equal batches share and two different ones almost never do."""
    tensors: list[torch.Tensor] = []
    apply_to_collection(batch, torch.Tensor, tensors.append)
    if not tensors:
        return torch.zeros((), dtype=torch.float64)
    return torch.stack([t.detach().double().sum() + t.numel() for t in tensors]).sum()


class ShardCheck(Callback):
    """Stops a multi-process fit at its start, in one line, where a batch sampler of yours
    was rebuilt so that it does not read its batches from this rank's share, or where a
    stream gives every rank the same first batch (`kit/shards.py` says why)."""

    def __init__(self) -> None:
        self._checked: set[str] = set()

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._checked = set()

    def _check(self, trainer: Trainer, split: str, loaders: list[Any]) -> None:
        if split in self._checked or trainer.world_size == 1 or not lightning_shards(trainer):
            return  # (--trainer.use_distributed_sampler false: the loaders are the user's)
        self._checked.add(split)
        for number, loader in enumerate(loaders):
            why = misread_batch_sampler(loader)
            if why is not None:
                which = f"{split} DataLoader" + (f" {number}" if len(loaders) > 1 else "")
                raise ConfigError(
                    f"the {which}'s batch sampler: under {trainer.world_size} processes"
                    f" Lightning rebuilt it around a DistributedSampler, and {why}: {WAY_OUT}"
                )

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._check(trainer, "training", train_loaders(trainer))

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == "fit":
            self._check(trainer, "validation", as_list(trainer.val_dataloaders))

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if "stream" in self._checked or trainer.world_size == 1:
            return
        self._checked.add("stream")
        streams = [
            type(getattr(loader.dataset, "dataset", loader.dataset)).__name__
            for loader in train_loaders(trainer)
            if isinstance(getattr(loader, "dataset", None), IterableDataset)
        ]
        if not streams:
            return
        mine = fingerprint(batch).to(pl_module.device)
        spread = torch.stack([mine, -mine])  # the largest, and minus the smallest
        torch.distributed.all_reduce(spread, op=torch.distributed.ReduceOp.MAX)
        if bool(spread[0] == -spread[1]):  # all the same; once a fit: one wait for the device
            raise ConfigError(
                f"the training stream {streams[0]} gave each of the {trainer.world_size}"
                " processes the same first batch: it must split itself among them (take"
                " the rank and the number of processes in its __init__, which runs after"
                " they are set up, and the loader worker from get_worker_info())"
            )
