"""What a checkpoint carries so that a resumed run is the same run.

Lightning's checkpoint holds the weights, the optimizer and scheduler states,
the loops' counters and each callback's state. `ResumeState` adds the rest:

- each rank's random states (Python, NumPy, torch, and CUDA on the rank's own
  device), restored just before the first step after the resume;
- the position of each training `ResumableLoader`: its seed, its epoch and the
  batches of it trained (Lightning's count, not the loader's, which is ahead
  by the batch Lightning prefetched). On resume the loader starts again there
  (`resume_at`): the next batch of the same order, each sample drawing the
  same random augmentation (its draws are seeded by the sample and the epoch).

With `seed_everything` on the CPU, an interrupted and resumed run then ends
with the same weights as an uninterrupted one, bit for bit. Where that cannot
hold (a DataLoader that keeps no position, another world size, CUDA's
non-deterministic kernels), the resume says so in one line as it starts.
"""

import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from .callbacks import train_loaders
from .data import ResumableLoader, is_in_memory
from .internals import restart_train_iteration


def random_states(device: torch.device | None = None) -> dict[str, Any]:
    """This process's random states, as plain values a weights-only load accepts.

    Lightning's collector reads every visible GPU's state (making a context on
    each, from every rank) and keeps NumPy's as an array, which a weights-only
    load refuses; hence this one.
    """
    name, keys, position, has_gauss, gauss = np.random.get_state()
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (name, keys.tolist(), position, has_gauss, gauss),
        "torch": torch.get_rng_state(),
    }
    if device is not None and device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    return states


def set_random_states(states: Mapping[str, Any], device: torch.device | None = None) -> None:
    """Restore what `random_states` returned."""
    version, internal, gauss_next = states["python"]
    random.setstate((version, tuple(internal), gauss_next))
    name, keys, position, has_gauss, gauss = states["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), position, has_gauss, gauss))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and device is not None and device.type == "cuda":
        torch.cuda.set_rng_state(states["cuda"], device)


def positions(trainer: Trainer) -> list[dict[str, int] | None]:
    """Where each training ResumableLoader resumes: its seed, epoch and the batches of it
    trained (the next epoch's start once its last batch was)."""
    progress = trainer.fit_loop.epoch_loop.batch_progress
    done = progress.current.processed
    finished = bool(progress.is_last_batch) and done == progress.current.ready
    epochs_on, batches = (1, 0) if finished else (0, done)
    return [
        {"seed": loader.seed, "epoch": loader.epoch + epochs_on, "batches": batches}
        if isinstance(loader, ResumableLoader)
        else None
        for loader in train_loaders(trainer)
    ]


class ResumeState(Callback):
    """Each rank's random states and the training loaders' positions in the checkpoint,
    restored on resume; one line at the start of a resume for each reason it cannot
    be exact."""

    def __init__(self) -> None:
        self._trainer: Trainer | None = None
        self._pending: dict[str, Any] | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._trainer = trainer  # state_dict() is called without it

    def state_dict(self) -> dict[str, Any]:
        trainer = self._trainer
        if trainer is None or trainer.state.fn != "fit":
            return {}
        mine = random_states(trainer.strategy.root_device)
        world = trainer.world_size
        if world > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            every: list[Any] = [None] * world
            torch.distributed.all_gather_object(every, mine)  # every rank saves together
        else:
            every = [mine]
        return {"world_size": world, "random_states": every, "loaders": positions(trainer)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = dict(state_dict) if state_dict else None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.ckpt_path:
            self._pending = None  # a fresh fit: nothing restored

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.ckpt_path:
            return
        loaders = train_loaders(trainer)
        saved = (self._pending or {}).get("loaders") or []
        moved = False
        for loader, position in zip(loaders, saved, strict=False):
            if isinstance(loader, ResumableLoader) and position:
                loader.resume_at(**position)
                moved = True
        if moved:  # Lightning made the loaders' iterators before: make them again
            restart_train_iteration(trainer)
        for line in self.inexact(trainer, loaders):
            rank_zero_info(f"resume: {line}")

    def inexact(self, trainer: Trainer, loaders: list[Any]) -> list[str]:
        """Why this resume will not repeat the uninterrupted run exactly, one line each."""
        lines = []
        saved = self._pending
        if saved is None:
            lines.append(
                f"{trainer.ckpt_path} holds no random states (written by an older kit):"
                " random draws after the resume differ from an uninterrupted run"
            )
        elif saved["world_size"] != trainer.world_size:
            lines.append(
                f"saved by {saved['world_size']} processes, resumed by {trainer.world_size}:"
                " the data order and random draws differ from an uninterrupted run; resume"
                f" with {saved['world_size']} processes (devices x nodes) to make it exact"
            )
        for loader in loaders:
            if not isinstance(loader, ResumableLoader) and not (
                callable(getattr(loader, "state_dict", None)) and hasattr(loader, "load_state_dict")
            ):
                lines.append(
                    f"the training {type(loader).__name__} keeps no position: a resumed epoch"
                    " starts again in a new order; return a kit.data.ResumableLoader (a"
                    " drop-in DataLoader) from train_dataloader() to continue it exactly"
                )
            elif getattr(loader, "seed_samples", True) is False and not is_in_memory(
                loader.dataset
            ):
                lines.append(
                    "the training data is read with seed_samples off: random augmentation in"
                    " its __getitem__ draws other numbers than an uninterrupted run's"
                )
        on_cuda = trainer.strategy.root_device.type == "cuda"
        if on_cuda and not torch.are_deterministic_algorithms_enabled():
            lines.append(
                "some CUDA kernels are not deterministic: the resumed run matches an"
                " uninterrupted one to rounding, not bit for bit; --trainer.deterministic"
                " true makes it exact (and slower)"
            )
        return lines

    def on_train_batch_start(self, trainer: Trainer, pl_module, batch: Any, batch_idx: int) -> None:
        saved, self._pending = self._pending, None
        if saved is not None and saved["world_size"] == trainer.world_size:
            set_random_states(
                saved["random_states"][trainer.global_rank], trainer.strategy.root_device
            )
