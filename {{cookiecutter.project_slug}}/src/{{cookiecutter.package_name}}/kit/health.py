"""`TrainingHealth`: is the accelerator busy, or waiting for data?

It follows the usual tuning order (data first, then compute, then memory,
then parallelism): at the end of fit, and every `every_n_steps` if asked, rank
0 reports samples per second, the share of step time spent waiting for the
next batch (over every step but the first, which counts the FLOPs), a training
step's FLOPs and the FLOP/s achieved, MFU against the device's peak
(`kit/peaks.py`), the peak memory allocated on each CUDA device, the
effective batch size and what saving checkpoints in the background cost the
steps. It adds no device sync to any step.

Under DDP and FSDP every rank waits for the slowest, so at the end of fit it
gathers each rank's step time, data wait and what the rank takes to reach the
step's gradient sync (data wait + forward), one line a rank, and names a rank
20% slower than the median with its likeliest cause: its loader or its compute.

Where the time goes is read off the clock that sees it. On the CPU that is the
host clock: the time from one batch's end to the next one's start is data
wait. On CUDA the host runs ahead of the device, so host time says little: two
CUDA events per step, read once they have passed (never waited for), give the
device's own time in the steps and idle between them, waiting for the host to
bring the next batch. The clock and the events are attributes
(`TrainingHealth.clock`, `TrainingHealth.event`), so tests drive them by hand
instead of depending on how fast the machine is.

Kept rather than Lightning's: its ThroughputMonitor synchronizes the device at
every step to time it, and `measure_flops` runs a forward and backward of its
own; here the FLOPs are those of the first real step (torch's FlopCounterMode),
and nothing waits for the device.
"""

import warnings
from collections import deque
from collections.abc import Callable
from operator import itemgetter
from time import perf_counter
from typing import Any, cast

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from .callbacks import loader_facts
from .checkpoints import background_writer
from .internals import is_compiled
from .peaks import cuda_peak

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
    """The device's dense peak FLOP/s for the precision in use; None where unknown (CPUs)."""
    if device.type != "cuda":
        return None
    return cuda_peak(device, compute_dtype(precision))


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


# The BatchNorm layers (a lazy one becomes one of these once it has run).
BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


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
    # Those that normalise by the batch: one in eval mode (a frozen backbone's) uses its
    # running statistics, whatever the batch.
    norms = [
        m
        for m in model.modules()
        if isinstance(m, BATCH_NORMS) and (m.training or not m.track_running_stats)
    ]
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


LOADER = "its loader (more --data.num_workers, data on a local disk)"
COMPUTE = "its compute (a slower, throttled or shared device, or heavier batches)"
# Strategies whose forward can all-gather parameters (FSDP; DeepSpeed's ZeRO-3).
SHARDED = (FSDPStrategy, ModelParallelStrategy, DeepSpeedStrategy)


def slow_rank(
    ranks: list[dict[str, Any]], sharded: bool, threshold: float = 0.2
) -> dict[str, Any] | None:
    """The rank that holds the others up at each step's gradient sync: its rank, cause and
    message; None when none is `threshold` slower than the median rank.

    All ranks leave a step's gradient all-reduce together, so data wait plus step time is
    about the same on each: the fast ones wait inside the collectives. A rank is slow by
    what it takes to reach the sync (`sync_ms`): its data wait plus its forward.
    """
    wait, arrival = itemgetter("data_wait_ms"), itemgetter("sync_ms")

    def median(key: Callable[[dict], float]) -> dict[str, Any]:  # the lower one: a real rank
        return sorted(ranks, key=key)[(len(ranks) - 1) // 2]

    typical, slowest = median(arrival), max(ranks, key=arrival)
    # Under FSDP the forward all-gathers (a fast rank waits in it): only the data wait tells.
    if not sharded and arrival(slowest) >= (1 + threshold) * arrival(typical) > 0:
        head = f"is {arrival(slowest) / arrival(typical):.1f}x slower than the median to reach"
        head += " each step's gradient sync"
        data = wait(slowest) - wait(typical) >= slowest["forward_ms"] - typical["forward_ms"]
    else:
        # A slow loader holds every rank up wherever the others wait for it: FSDP's
        # all-gathers, or DDP's buffer broadcast or SyncBatchNorm in the forward.
        typical, slowest = median(wait), max(ranks, key=wait)
        late = (wait(slowest) - wait(typical)) / (wait(typical) + typical["step_ms"] or 1)
        if late < threshold:
            return None
        head, data = f"holds up each step's gradient sync by {100 * late:.0f}% of a step", True
    key, fix = ("data_wait_ms", LOADER) if data else ("forward_ms", COMPUTE)
    what = "it waits {:.0f} ms a step for data" if data else "its forward takes {:.0f} ms a step"
    why = f"{what.format(slowest[key])} (the median rank {typical[key]:.0f} ms): {fix}"
    message = f"rank {slowest['rank']} {head}: {why}"
    return {"rank": slowest["rank"], "cause": "data" if data else "compute", "message": message}


def saving(trainer: Trainer) -> dict[str, Any]:
    """What saving checkpoints in the background cost the steps (kit/checkpoints.py)."""
    writer = background_writer(trainer)
    if writer is None:
        return {"background_saves": None, "save_copy_s": None, "save_wait_s": None}
    return {
        "background_saves": writer.saves,
        "save_copy_s": round(writer.copy_seconds, 3),
        "save_wait_s": round(writer.wait_seconds, 3),
    }


class TrainingHealth(Callback):
    """Throughput, data wait, FLOPs and MFU, peak memory and effective batch, on rank 0.

    Args:
        every_n_steps: also print the report every this many training steps; 0: only
            at the fit's end.
        data_wait_warn: the share of step time waiting for data (0 to 1) above which
            the report says what to try.
    """

    clock: Callable[[], float] = staticmethod(perf_counter)
    # A CUDA event that records timing; `events` None means: on CUDA devices.
    event: Callable[[], Any] = staticmethod(lambda: torch.cuda.Event(enable_timing=True))
    events: bool | None = None
    # Every rank's tensor, stacked; tests gather fake ranks' figures.
    gather: Callable[[LightningModule, torch.Tensor], torch.Tensor] = staticmethod(
        lambda module, tensor: module.all_gather(tensor)
    )

    def __init__(self, every_n_steps: int = 0, data_wait_warn: float = 0.3) -> None:
        self.every_n_steps = every_n_steps
        self.data_wait_warn = data_wait_warn
        self.summary: dict[str, Any] = {}
        self._device_clock = False
        self._loaded: dict[str, Any] | None = None
        self._advised = False  # the BatchNorm advice given, once a fit
        self._reset()

    def _reset(self) -> None:
        self.wait = self.compute = self.forward = 0.0
        self.samples = self.steps = self.timed_steps = 0
        self._ready = self._start = self._sync = None
        self._since = (0.0, 0.0, 0.0, 0)  # this process's own counters start here
        self._steps_before = 0
        # Steps not yet read off the clock: (previous step's end, start, backward, end, samples).
        self._pending: deque[tuple[Any, Any, Any, Any, int]] = deque()
        self.flops_per_batch: int | None = None
        self._counter: FlopCounterMode | None = None
        self._peak_unknown_said = False

    def _now(self) -> Any:
        """A point in time: a float on the host clock, or a recorded CUDA event."""
        if not self._device_clock:
            return self.clock()
        mark = self.event()
        mark.record()
        return mark

    def _seconds(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1000 if self._device_clock else end - start

    def _read_clock(self, wait: bool = False) -> None:
        """Add the steps whose end has passed to the totals (`wait`: all of them, waiting
        for the device once; only outside the steps)."""
        if wait and self._device_clock and self._pending:
            self._pending[-1][3].synchronize()
        while self._pending and (not self._device_clock or self._pending[0][3].query()):
            before, start, sync, end, samples = self._pending.popleft()
            if before is not None:
                self.wait += self._seconds(before, start)
            self.compute += self._seconds(start, end)
            self.forward += self._seconds(start, end if sync is None else sync)
            self.samples += samples
            self.timed_steps += 1

    # The counters go into checkpoints: a resumed run's report covers the whole run.
    COUNTERS = ("wait", "compute", "forward", "samples", "steps", "timed_steps", "flops_per_batch")

    def state_dict(self) -> dict[str, Any]:
        self._read_clock(wait=True)  # a device clock's pending steps, read at a save only
        return {name: getattr(self, name) for name in self.COUNTERS}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._loaded = dict(state_dict)

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._reset()
        self._advised = False
        loaded, self._loaded = self._loaded, None
        if loaded and trainer.ckpt_path:
            for name in self.COUNTERS:
                setattr(self, name, loaded.get(name, getattr(self, name)))
        # A checkpoint holds rank 0's counters: each rank's own figures start here.
        self._since = (self.compute, self.wait, self.forward, self.timed_steps)
        self._steps_before = self.steps  # a finished run resumed trains none: no report
        self.summary = {}
        device = trainer.strategy.root_device
        self._device_clock = device.type == "cuda" if self.events is None else self.events
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def _advise(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """BatchNorm's advice, with the modes the model trains in (its hooks have run)."""
        self._advised = True
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
        self._ready = self._now()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not self._advised:
            self._advise(trainer, pl_module)
        if self.steps == 0 and self.flops_per_batch is None and not is_compiled(pl_module):
            # Count the first step's FLOPs as it runs: no extra forward, nothing to copy.
            self._counter = FlopCounterMode(display=False)
            self._counter.__enter__()
        self._sync = None
        self._start = self._now()

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        # Under DDP the backward all-reduces the gradients: this rank has reached the sync.
        if self._sync is None and self.steps > 0:  # the first backward of a timed step
            self._sync = self._now()

    def _stop_counting(self) -> None:
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self.flops_per_batch = self._counter.get_total_flops() or None
            self._counter = None

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._stop_counting()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        end = self._now()
        self._stop_counting()
        # The fit's first step is not timed: it counts the FLOPs, and compiles and
        # loads kernels for the first time.
        if self._start is not None and self.steps > 0:
            self._pending.append((self._ready, self._start, self._sync, end, batch_length(batch)))
        self._ready = end
        self.steps += 1
        self._read_clock()
        if self.every_n_steps and self.steps % self.every_n_steps == 0:
            self.report(trainer, pl_module, final=False)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._read_clock(wait=True)
        if self.steps > self._steps_before:
            self.report(trainer, pl_module, final=True)

    def measure(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
        busy = self.wait + self.compute
        device = trainer.strategy.root_device
        peaks = None
        if device.type == "cuda":
            peak = torch.tensor(float(torch.cuda.max_memory_allocated(device)), device=device)
            gathered = cast(torch.Tensor, pl_module.all_gather(peak)).reshape(-1)
            peaks = [round(float(p) / MIB, 1) for p in gathered]
        flops_per_s = mfu = peak = None
        if self.flops_per_batch and self.compute:
            # Per device: the FLOPs of its own batches over the time its steps took.
            flops_per_s = self.flops_per_batch * self.timed_steps / self.compute
            peak = peak_flops(device, trainer.precision)
            mfu = flops_per_s / peak if peak else None
        return {
            "batches": self.steps,
            "optimizer_steps": trainer.global_step,
            "samples_per_s": round(self.samples * trainer.world_size / busy, 1) if busy else None,
            "data_wait_share": round(self.wait / busy, 3) if busy else None,
            "clock": "device" if self._device_clock else "host",
            "flops_per_batch": self.flops_per_batch,
            "flops_per_s": flops_per_s,
            "peak_flops": peak,
            "mfu": mfu,
            "peak_unknown": (
                f"{torch.cuda.get_device_name(device)} in {compute_dtype(trainer.precision)}"
                if flops_per_s and peak is None and device.type == "cuda"
                else None
            ),
            "peak_memory_mib": peaks,
            "effective_batch_size": loader_facts(trainer)["effective_batch_size"],
            "batch_sampler": loader_facts(trainer)["batch_sampler"],
            **saving(trainer),
        }

    def measure_ranks(self, trainer: Trainer, pl_module: LightningModule) -> list[dict[str, Any]]:
        """Each rank's ms a step in this process's run (one all_gather, at the end of fit)."""
        steps = self.timed_steps - self._since[3]
        if not steps:  # on every rank alike
            return []
        totals = zip((self.compute, self.wait, self.forward), self._since[:3], strict=True)
        mine = torch.tensor([1000 * (now - then) / steps for now, then in totals])
        with warnings.catch_warnings():  # Lightning's all_gather calls one torch deprecates
            warnings.filterwarnings("ignore", r"torch\.distributed\.nn\.functional\.all_gather")
            rows = self.gather(pl_module, mine.to(trainer.strategy.root_device)).reshape(-1, 3)
        ranks = []
        for rank, (step, wait, forward) in enumerate(rows.tolist()):
            ranks.append({"rank": rank, "step_ms": round(step, 1), "data_wait_ms": round(wait, 1)})
            ranks[-1] |= {"forward_ms": round(forward, 1), "sync_ms": round(wait + forward, 1)}
        return ranks

    def report_ranks(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Under DDP and FSDP: one line a rank, and the rank that holds the others up."""
        self.summary["ranks"] = ranks = self.measure_ranks(trainer, pl_module)
        self.summary["slow_rank"] = None
        if len(ranks) < 2:
            return
        sharded, lines = isinstance(trainer.strategy, SHARDED), []
        for r in ranks:
            line = f"rank {r['rank']}: step {r['step_ms']}, data wait {r['data_wait_ms']}"
            sync = f", to reach the gradient sync (data wait + forward) {r['sync_ms']}"
            lines.append(line + ("" if sharded else sync))
        rank_zero_info("Training health per rank, ms a step:\n  " + "\n  ".join(lines))
        self.summary["slow_rank"] = slow = slow_rank(ranks, sharded)
        if slow:
            rank_zero_warn(slow["message"])

    def report(self, trainer: Trainer, pl_module: LightningModule, final: bool) -> None:
        # Every rank measures (the memory gather is a collective); rank 0 prints.
        self.summary = facts = self.measure(trainer, pl_module)
        parts = []
        if facts["samples_per_s"] is None:  # a single step: the first is not timed
            parts.append("too few steps to time")
        else:
            parts.append(f"{facts['samples_per_s']} samples/s")
        if facts["data_wait_share"] is not None:
            parts.append(
                f"data wait {100 * facts['data_wait_share']:.0f}% of step time"
                f" ({facts['clock']} clock)"
            )
        if facts["flops_per_batch"]:
            flops = f"{short_number(facts['flops_per_batch'])}FLOP per training step"
            flops += " (forward and backward)"
            if facts["flops_per_s"]:
                flops += f", {short_number(facts['flops_per_s'])}FLOP/s per device"
            parts.append(flops)
        if facts["mfu"] is not None:
            parts.append(f"MFU {100 * facts['mfu']:.3g}%")
        elif facts["peak_unknown"] and not self._peak_unknown_said:
            self._peak_unknown_said = True  # once a run: it will not become known
            parts.append(f"MFU: peak unknown for {facts['peak_unknown']}")
        if facts["peak_memory_mib"]:
            peaks = ", ".join(f"{p} MiB" for p in facts["peak_memory_mib"])
            parts.append(f"peak memory per device: {peaks}")
        if facts["effective_batch_size"]:
            parts.append(f"effective batch {facts['effective_batch_size']}")
        elif facts.get("batch_sampler"):
            parts.append(f"effective batch as {facts['batch_sampler']} makes them")
        if facts.get("background_saves"):
            parts.append(
                f"{facts['background_saves']} checkpoints written in the background, the steps"
                f" waiting {facts['save_copy_s']:.2f} s to copy them to host memory and"
                f" {facts['save_wait_s']:.2f} s for a write still in flight"
            )
        # Batches trained; optimizer steps too where they differ (several optimizers
        # stepped by hand, or gradients accumulated).
        counted = f"{facts['batches']} batches"
        if facts["optimizer_steps"] != facts["batches"]:
            counted += f", {facts['optimizer_steps']} optimizer steps"
        parts.append(counted)
        title = "Training health: " if final else "Training health so far: "
        rank_zero_info(title + " | ".join(parts))
        if final:
            self.report_ranks(trainer, pl_module)
        if final and (facts["data_wait_share"] or 0) > self.data_wait_warn:
            workers = loader_facts(trainer)["num_workers"]
            rank_zero_warn(
                f"The model waited for data {100 * facts['data_wait_share']:.0f}% of the step "
                f"time (threshold {100 * self.data_wait_warn:.0f}%). In this order: 1. more "
                f"loader workers (--data.num_workers, now {workers}); 2. a lighter __getitem__ "
                "(decode and augment offline, return tensors); 3. pinned memory on CUDA "
                "(--data.pin_memory true); 4. precompute features once and load them as tensors."
            )
