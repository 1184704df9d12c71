"""What a checkpoint carries so that a resumed run is the same run.

Lightning's checkpoint holds the weights, the optimizer and scheduler states,
the loops' counters and each callback's state. `ResumeState` adds the rest:

- each rank's random states (Python, NumPy, torch, and CUDA on the rank's own
  device), restored just before the first step after the resume;
- the position of each training `ResumableLoader` in global terms: its seed,
  its epoch and the samples of it all ranks trained (Lightning's count of
  batches, not the loader's, which is ahead by the batch Lightning
  prefetched). On resume the loader starts again there (`resume_at`): the
  next batch of the same order, each sample drawing the same random
  augmentation (its draws are seeded by the sample and the epoch);
- the global batch: per-device batch x processes x accumulation.

With `seed_everything` on the CPU, an interrupted and resumed run then ends
with the same weights as an uninterrupted one, bit for bit. On another number
of processes the global batch is kept (`accumulate_grad_batches` set to make
it, said in one line) and every optimizer step trains the same samples
(`GlobalOrder`): the weights match to float precision (sums in another order).
Where a resume cannot be exact (dropout or BatchNorm statistics of each
process's own on another number of them, another accelerator or precision, a
DataLoader that keeps no position, CUDA's non-deterministic kernels), it says
so in one line as it starts.
"""

import platform
import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import nn

from .callbacks import train_loaders
from .data import ResumableLoader, is_in_memory
from .health import BATCH_NORMS
from .internals import restart_train_iteration, saved_batch_progress
from .spec import ConfigError

DROPOUTS = (
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.FeatureAlphaDropout,
)


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
    """Where each training ResumableLoader resumes: its seed, epoch and the samples of it
    all ranks trained (the next epoch's start once its last batch was)."""
    progress = trainer.fit_loop.epoch_loop.batch_progress
    done = progress.current.processed
    finished = bool(progress.is_last_batch) and done == progress.current.ready
    epochs_on, batches = (1, 0) if finished else (0, done)
    return [
        {
            "seed": loader.seed,
            "epoch": loader.epoch + epochs_on,
            "samples": batches * loader.world_batch,
            "order": loader.order,
            "workers": loader.num_workers,  # a stream's order is its workers'
        }
        if isinstance(loader, ResumableLoader)
        else None
        for loader in train_loaders(trainer)
    ]


# Why the steps of a resume on another number of processes train other samples, by how
# the training order was made (`ResumableLoader.order`; None: no position was kept).
OTHER_SAMPLES = {
    "stream": "the training stream splits itself among the processes",
    "batches": "your batch sampler is dealt out to the processes a batch at a time",
    "sampler": "the training sampler is not the kit's GlobalOrder",
    "unsaid": "the checkpoint does not say how its order was made (an older kit's)",
    None: "the training DataLoader keeps no position",
}


def orders_of(saved: Mapping[str, Any]) -> set[str | None]:
    """How the saved training loaders made their orders (`ResumableLoader.order`)."""
    return {
        position.get("order", "unsaid") if position else None
        for position in saved.get("loaders") or [None]
    }


def same_samples(saved: Mapping[str, Any]) -> str | None:
    """None where every step on another number of processes trains the samples it did,
    else why not."""
    reasons = [OTHER_SAMPLES[order] for order in orders_of(saved) if order != "global"]
    return reasons[0] if reasons else None


def batch_size(trainer: Trainer) -> int | None:
    """The per-device batch size of the fit: its training loader's once built (1 where a
    batch sampler of yours sizes each batch: a batch is the unit), else its DataModule's
    (or model's) `batch_size`; None where neither says."""
    for loader in train_loaders(trainer):
        if getattr(loader, "batch_size", None):
            return loader.batch_size
        if getattr(loader, "order", None) == "batches":
            return 1
    for holder in (trainer.datamodule, trainer.lightning_module):
        size = getattr(holder, "batch_size", None)
        if isinstance(size, int):
            return size
    return None


def per_process(model: nn.Module) -> list[str]:
    """What in `model` draws or keeps numbers of each process's own: dropout layers and
    BatchNorm statistics (SyncBatchNorm's are the world's)."""
    found = []
    dropouts = [name for name, m in model.named_modules() if isinstance(m, DROPOUTS) and m.p > 0]
    if dropouts:
        found.append(f"dropout ({', '.join(dropouts[:3])}) draws from each process's generator")
    norms = [
        name
        for name, m in model.named_modules()
        if isinstance(m, BATCH_NORMS)
        and not isinstance(m, nn.SyncBatchNorm)
        and m.track_running_stats
    ]
    if norms:
        found.append(f"BatchNorm ({', '.join(norms[:3])}) keeps each process's running statistics")
    return found


def adjusted_counts(progress: dict[str, Any], was: int, now: int) -> bool:
    """Recount a saved batch progress (each rank's batches of `was` samples, all ranks
    together) in batches of `now`; whether they make whole batches. The counts a save
    in `on_train_batch_end` leaves behind the processed one (Lightning completes
    that batch on resume) stay as far behind."""
    whole = True
    for part in ("total", "current"):
        counts = progress.get(part, {})
        processed = counts.get("processed", 0)
        whole = whole and processed * was % now == 0
        for key, value in counts.items():
            counts[key] = processed * was // now - (processed - value)
    return whole


def device_name(device: torch.device) -> str:
    """What a run trained on, as a person names it: the GPU's model, else the CPU's kind."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.machine() or 'unknown'} {device.type}".strip()


class ResumeState(Callback):
    """Saves what a resume needs to continue the same run, and says what it cannot keep.

    Each rank's random states, the training loaders' positions and the global batch go
    in the checkpoint and are restored on resume; one line at the start of a resume
    says each reason it cannot be exact.

    On another number of processes (or another per-device batch) the global batch
    is kept: `accumulate_grad_batches` becomes what makes it, and the resume says
    so; where no whole number does, it is refused with the choices.

    Args:
        keep_global_batch: on another number of processes or batch size, keep the
            saved global batch by changing `accumulate_grad_batches`; false: go on
            with the batch as configured.
    """

    def __init__(self, keep_global_batch: bool = True) -> None:
        self.keep_global_batch = keep_global_batch
        self._trainer: Trainer | None = None
        self._pending: dict[str, Any] | None = None
        self._notes: list[str] = []
        self._worlds: tuple[int, int] | None = None  # (saved by, resumed by), where they differ

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
        return {
            "world_size": world,
            "batch_size": batch_size(trainer),
            "accumulate": trainer.accumulate_grad_batches,
            "accelerator": trainer.strategy.root_device.type,
            "device": device_name(trainer.strategy.root_device),  # for a model card
            "precision": str(trainer.precision),
            "random_states": every,
            "loaders": positions(trainer),
            "frozen": frozen(trainer.lightning_module),
            "untracked": untracked(trainer.lightning_module),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = dict(state_dict) if state_dict else None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.ckpt_path:
            self._pending = None  # a fresh fit: nothing restored

    def on_load_checkpoint(
        self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Keep the checkpoint's global batch on this run's processes and batch: set the
        accumulation that makes it, and count the batches trained in this run's batches."""
        self._notes, self._worlds = [], None
        saved = saved_state(checkpoint, self.state_key)
        if trainer.state.fn != "fit" or not saved or not saved.get("batch_size"):
            return
        world, size, accumulate = saved["world_size"], saved["batch_size"], saved["accumulate"]
        # (The loaders are not built yet: a batch sampler of yours counts in batches.)
        by_batches = "batches" in orders_of(saved)
        now, size_now = trainer.world_size, 1 if by_batches else batch_size(trainer) or size
        given = accumulate_now = trainer.accumulate_grad_batches
        global_batch = size * world * accumulate
        if self.keep_global_batch:
            accumulates = pl_module.automatic_optimization
            accumulate_now = keep_global_batch(global_batch, now, size_now, accumulates)
            trainer.accumulate_grad_batches = accumulate_now
        if (world, size, accumulate) == (now, size_now, accumulate_now):
            if given != accumulate_now:
                self._notes.append(
                    f"accumulate_grad_batches {accumulate_now}, not {given}: the checkpoint's"
                    " global batch (--resume_state.keep_global_batch false trains on with yours)"
                )
            return
        progress = saved_batch_progress(checkpoint)
        whole = adjusted_counts(progress, size * world, size_now * now)
        line = (
            f"saved by {processes(world)}, resumed by {now}: the global batch was {global_batch}"
            f"{' batches' if by_batches else ''} ({size} per device x {world} x {accumulate}), is"
            f" {size_now * now * accumulate_now} ({size_now} x {now} x {accumulate_now})"
        )
        other = same_samples(saved)
        if size_now * now * accumulate_now == global_batch and whole and other is None:
            line += "; each step trains the same samples, summed in another order (float precision)"
        else:
            line += "; the steps from here train other samples than an uninterrupted run"
            line += f" ({other})" if other and world != now else ""
        self._notes.append(line)
        if world != now:  # named as training starts, once which layers train is restored
            self._worlds = (world, now)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.ckpt_path:
            return
        loaders = train_loaders(trainer)
        saved = (self._pending or {}).get("loaders") or []
        moved = False
        for loader, position in zip(loaders, saved, strict=False):
            if isinstance(loader, ResumableLoader) and position:
                if "batches" in position:  # written before positions were global
                    position = {**position, "samples": position.pop("batches") * loader.world_batch}
                position = {key: position[key] for key in ("seed", "epoch", "samples")}  # where
                loader.resume_at(**position)
                moved = True
        if moved:  # Lightning made the loaders' iterators before: make them again
            restart_train_iteration(trainer)
        if self._pending and "frozen" in self._pending:
            # Which weights train, and which BatchNorm layers keep statistics, is the run's
            # state too (a fine-tune that unfroze some, as Lightning's BaseFinetuning does,
            # whose setup freezes them all again): as saved, before this epoch's hooks run.
            set_frozen(pl_module, self._pending["frozen"], self._pending.get("untracked", []))
        if trainer.fit_loop.restarted_mid_epoch:
            replay_epoch_start(trainer, pl_module)
        if self._worlds is not None:
            world, now = self._worlds
            self._notes += [
                f"{what}: on {processes(now)}, not {world}, it differs from an uninterrupted run"
                for what in per_process(pl_module)
            ]
        for line in self.inexact(trainer, loaders):
            rank_zero_info(f"resume: {line}")

    def inexact(self, trainer: Trainer, loaders: list[Any]) -> list[str]:
        """Why this resume will not repeat the uninterrupted run exactly, one line each."""
        lines = list(self._notes)
        saved = self._pending
        if saved is None:
            lines.append(
                f"{trainer.ckpt_path} holds no random states (written by an older kit):"
                " random draws after the resume differ from an uninterrupted run"
            )
        elif saved["world_size"] != trainer.world_size and not lines:
            lines.append(
                f"saved by {saved['world_size']} processes, resumed by {trainer.world_size}:"
                " the random draws differ from an uninterrupted run"
            )
        for key, now in (
            ("accelerator", trainer.strategy.root_device.type),
            ("precision", str(trainer.precision)),
        ):
            if saved and saved.get(key, now) != now:
                lines.append(
                    f"saved with {key} {saved[key]}, resumed with {now}: the numbers differ"
                    " from an uninterrupted run from here on"
                )
        positions = (saved or {}).get("loaders") or []
        for loader, position in zip(loaders, positions, strict=False):
            was = (position or {}).get("workers", loader.num_workers)
            if getattr(loader, "order", None) == "stream" and was != loader.num_workers:
                lines.append(
                    f"the training stream was read by {was} loader workers, now"
                    f" {loader.num_workers}: each worker reads its own part of it, so its"
                    " batches come in another order than an uninterrupted run's"
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
                    "the training data is read with seed_samples off: random augmentation as it"
                    " is read draws other numbers than an uninterrupted run's"
                )
            elif loader.order == "stream" and not callable(
                getattr(loader.dataset, "set_epoch", None)
            ):
                lines.append(
                    f"the training stream {type(loader.dataset.dataset).__name__} has no"
                    " set_epoch(epoch): an order it keeps from one epoch to the next starts"
                    " again here; give it set_epoch to order each epoch by its number"
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


def frozen(module: nn.Module) -> list[str]:
    """The names of the module's parameters that do not train now (requires_grad False)."""
    return [name for name, parameter in module.named_parameters() if not parameter.requires_grad]


def untracked(module: nn.Module) -> list[str]:
    """The names of the module's BatchNorm layers that keep no running statistics now
    (a frozen one, as BaseFinetuning freezes them), of those built to keep them."""
    return [
        name
        for name, layer in module.named_modules()
        if isinstance(layer, BATCH_NORMS)
        and layer.running_mean is not None
        and not layer.track_running_stats
    ]


def set_frozen(module: nn.Module, names: list[str], untracked: list[str]) -> None:
    """Make `names` the module's parameters that do not train, and `untracked` its
    BatchNorm layers that keep no running statistics; the others train and keep them."""
    still = set(names)
    for name, parameter in module.named_parameters():
        parameter.requires_grad_(name not in still)
    for name, layer in module.named_modules():
        if isinstance(layer, BATCH_NORMS) and layer.running_mean is not None:
            layer.track_running_stats = name not in untracked


def replay_epoch_start(trainer: Trainer, pl_module: LightningModule) -> None:
    """Call the `on_train_epoch_start` of your code (the LightningModule's, and your
    callbacks': not Lightning's, nor the kit's) again in an epoch resumed half-way, where
    Lightning calls it only at an epoch's start:
    what it sets (an unfrozen block, BatchNorm kept in eval mode, a schedule) holds for
    the rest of the epoch as it did in the uninterrupted run."""
    theirs = ("lightning.", "pytorch_lightning.", __name__.rpartition(".")[0] + ".")  # the kit
    called = []
    if is_overridden("on_train_epoch_start", pl_module):
        pl_module.on_train_epoch_start()
        called.append(type(pl_module).__name__)
    for callback in trainer.callbacks:
        hook = type(callback).on_train_epoch_start
        if hook is not Callback.on_train_epoch_start and not hook.__module__.startswith(theirs):
            callback.on_train_epoch_start(trainer, pl_module)
            called.append(type(callback).__name__)
    if called:
        hooks = ", ".join(f"{name}.on_train_epoch_start" for name in called)
        rank_zero_info(f"Resumed in the middle of epoch {trainer.current_epoch}: ran {hooks} again")


def processes(count: int) -> str:
    return f"{count} process" if count == 1 else f"{count} processes"


def saved_state(checkpoint: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    """A callback's state in a checkpoint: under its own key, or a part's of the kit's
    one callback (`KitCallbacks`)."""
    for name, state in (checkpoint.get("callbacks") or {}).items():
        if name == key:
            return state
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            return state[key]
    return None


def batch_choices(global_batch: int, world: int) -> list[tuple[int, int]]:
    """(per-device batch, accumulation) that make `global_batch` on `world` processes,
    the largest batch first."""
    if global_batch % world:
        return []
    per_process = global_batch // world
    return [
        (size, per_process // size) for size in range(per_process, 0, -1) if per_process % size == 0
    ]


def keep_global_batch(global_batch: int, world: int, size: int, accumulates: bool = True) -> int:
    """The accumulation that makes `global_batch` of `world` processes of `size` (only 1
    where the model steps its optimizers itself: Lightning accumulates none for it);
    refused in one line naming the per-device batches that would, where none does."""
    whole = global_batch % (world * size) == 0
    if whole and (accumulates or global_batch == world * size):
        return global_batch // (world * size)
    choices = [c for c in batch_choices(global_batch, world) if accumulates or c[1] == 1]
    named = ", ".join(f"{b} (accumulating {a})" for b, a in choices[:4])
    could = f"--data.batch_size {named}" if choices else f"no batch size makes it on {world}"
    how = (
        "no whole accumulation" if accumulates else "it without accumulation (manual optimization)"
    )
    raise ConfigError(
        f"the checkpoint trained global batches of {global_batch}; {world} processes of"
        f" {size} make {how}: resume with {could}, or with"
        " --resume_state.keep_global_batch false to train on with the batch as configured"
    )
