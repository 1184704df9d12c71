"""`TrainingHealth`: is the accelerator busy, or waiting for data?

It follows the guide's tuning order (data first, then compute, then memory,
then parallelism): at the end of fit, and every `every_n_steps` if asked, rank
0 reports samples per second, the share of step time spent waiting for the next
batch, the peak memory allocated on each CUDA device and the effective batch
size. It times with the host clock only: no device sync, nothing added to the
steps themselves. The clock is an attribute (`TrainingHealth.clock`), so tests
drive it by hand instead of depending on how fast the machine is.
"""

from collections.abc import Callable
from time import perf_counter
from typing import Any

import torch
from lightning.fabric.utilities.throughput import get_available_flops
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from {{ cookiecutter.package_name }}.kit.callbacks import loader_facts

MIB = 1024**2


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype the matrix multiplications of a Lightning precision run in."""
    precision = str(precision)
    if precision.startswith("bf16"):
        return torch.bfloat16
    if precision.startswith("16"):
        return torch.float16
    return torch.float64 if precision.startswith("64") else torch.float32


def peak_flops(device: torch.device, precision: str) -> float | None:
    """The device's peak FLOP/s for the precision in use; None where unknown (CPUs)."""
    if device.type != "cuda":
        return None
    return get_available_flops(device, compute_dtype(precision))


def is_compiled(module: nn.Module) -> bool:
    return any(getattr(m, "_compiled_call_impl", None) is not None for m in module.modules())


def short_number(value: float) -> str:
    """12.3 G, 4.56 T: FLOPs the way people read them."""
    for unit, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.3g} "


def batch_length(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, list | tuple) and batch:
        return batch_length(batch[0])
    return 0


def batchnorm_advice(
    model: nn.Module,
    world_size: int,
    accumulate: int,
    micro_batch: int | None,
    on_cuda: bool = True,
) -> str | None:
    """What to say about BatchNorm in this setup, or None.

    Off CUDA there is no SyncBatchNorm to suggest (the CLI already said it is off).
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return None
    synced = all(isinstance(m, nn.SyncBatchNorm) for m in norms)
    if world_size > 1 and not synced and on_cuda:
        return (
            f"BatchNorm under {world_size} ranks without sync_batchnorm: each rank normalises "
            "its own slice of the batch. Add --trainer.sync_batchnorm true (CUDA) to use the "
            "statistics of the global batch."
        )
    if accumulate > 1:
        return (
            f"BatchNorm with accumulate_grad_batches={accumulate}: it normalises each "
            f"micro-batch of {micro_batch or 'data.batch_size'} samples, not the effective batch. "
            "If that hurts, raise data.batch_size or use GroupNorm/LayerNorm."
        )
    return None


class TrainingHealth(Callback):
    """Throughput, data wait, peak memory and effective batch, on rank 0."""

    clock: Callable[[], float] = staticmethod(perf_counter)

    def __init__(self, every_n_steps: int = 0, data_wait_warn: float = 0.3) -> None:
        self.every_n_steps = every_n_steps
        self.data_wait_warn = data_wait_warn
        self.summary: dict[str, Any] = {}
        self._reset()

    def _reset(self) -> None:
        self.wait = self.compute = 0.0
        self.samples = self.steps = 0
        self._ready = self._start = None
        self.flops_per_batch: int | None = None
        self._counter: FlopCounterMode | None = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._reset()
        self.summary = {}
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(trainer.strategy.root_device)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        advice = batchnorm_advice(
            pl_module,
            trainer.world_size,
            trainer.accumulate_grad_batches,
            loader_facts(trainer)["batch_size"],
            on_cuda=trainer.strategy.root_device.type == "cuda",
        )
        if advice:
            rank_zero_warn(advice)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Fetching the epoch's first batch counts as waiting; validation does not.
        self._ready = self.clock()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.steps == 0 and self.flops_per_batch is None and not is_compiled(pl_module):
            # Count the first step's FLOPs as it runs: no extra forward, nothing to copy.
            self._counter = FlopCounterMode(display=False)
            self._counter.__enter__()
        self._start = self.clock()
        if self._ready is not None:
            self.wait += self._start - self._ready

    def _stop_counting(self) -> None:
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self.flops_per_batch = self._counter.get_total_flops() or None
            self._counter = None

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._stop_counting()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._ready = self.clock()
        self._stop_counting()
        if self._start is not None:
            self.compute += self._ready - self._start
        self.samples += batch_length(batch)
        self.steps += 1
        if self.every_n_steps and self.steps % self.every_n_steps == 0:
            self.report(trainer, pl_module, final=False)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.steps:
            self.report(trainer, pl_module, final=True)

    def measure(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
        busy = self.wait + self.compute
        device = trainer.strategy.root_device
        peaks = None
        if device.type == "cuda":
            peak = torch.tensor(float(torch.cuda.max_memory_allocated(device)), device=device)
            gathered = pl_module.all_gather(peak).reshape(-1)
            peaks = [round(float(p) / MIB, 1) for p in gathered]
        flops_per_s = mfu = None
        if self.flops_per_batch and self.compute:
            # Per device: the FLOPs of its own batches over the time its steps took.
            flops_per_s = self.flops_per_batch * self.steps / self.compute
            peak = peak_flops(device, trainer.precision)
            mfu = round(flops_per_s / peak, 4) if peak else None
        return {
            "steps": self.steps,
            "samples_per_s": round(self.samples * trainer.world_size / busy, 1) if busy else None,
            "data_wait_share": round(self.wait / busy, 3) if busy else None,
            "flops_per_batch": self.flops_per_batch,
            "flops_per_s": flops_per_s,
            "mfu": mfu,
            "peak_memory_mib": peaks,
            "effective_batch_size": loader_facts(trainer)["effective_batch_size"],
        }

    def report(self, trainer: Trainer, pl_module: LightningModule, final: bool) -> None:
        # Every rank measures (the memory gather is a collective); rank 0 prints.
        self.summary = facts = self.measure(trainer, pl_module)
        parts = [
            f"{facts['samples_per_s']} samples/s",
            f"data wait {100 * facts['data_wait_share']:.0f}% of step time",
        ]
        if facts["flops_per_batch"]:
            parts.append(
                f"{short_number(facts['flops_per_batch'])}FLOP per batch, "
                f"{short_number(facts['flops_per_s'])}FLOP/s per device"
            )
        if facts["mfu"] is not None:
            parts.append(f"MFU {100 * facts['mfu']:.1f}%")
        if facts["peak_memory_mib"]:
            peaks = ", ".join(f"{p} MiB" for p in facts["peak_memory_mib"])
            parts.append(f"peak memory per device: {peaks}")
        if facts["effective_batch_size"]:
            parts.append(f"effective batch {facts['effective_batch_size']}")
        parts.append(f"{facts['steps']} steps")
        title = "Training health: " if final else "Training health so far: "
        rank_zero_info(title + " | ".join(parts))
        if final and facts["data_wait_share"] > self.data_wait_warn:
            workers = loader_facts(trainer)["num_workers"]
            rank_zero_warn(
                f"The model waited for data {100 * facts['data_wait_share']:.0f}% of the step "
                f"time (threshold {100 * self.data_wait_warn:.0f}%). In this order: 1. more "
                f"loader workers (--data.num_workers, now {workers}); 2. a lighter __getitem__ "
                "(decode and augment offline, return tensors); 3. pinned memory on CUDA "
                "(--data.pin_memory true); 4. precompute features once and load them as tensors."
            )
