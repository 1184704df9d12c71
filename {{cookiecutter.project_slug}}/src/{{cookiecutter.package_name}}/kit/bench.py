"""`<command> bench`: where a training step's time goes here, and what to change first.

    <command> bench                        # 50 steps of each measurement
    <command> bench --steps 200 --json     # the figures, for tools
    <command> bench --batch_size auto      # the largest batch that fits the GPU first
    <command> bench -- --config configs/gpu.yaml

Three measurements of the project's own model and data, on this machine, with
the flags after `--` (any flag of `fit`):

(a) the loader alone: samples/s of the training DataLoader as configured
    (workers, pinned memory, data kept on the device);
(b) the step alone: `fit` on one batch held on the device, so no loading at
    all: the compute-bound samples/s, the step's FLOPs and MFU (where the
    device's peak is known) and its peak memory;
(c) the full loop: `fit` as configured: samples/s, the share of step time
    spent waiting for data, and the host time each step adds above (b).

Then one verdict, in the usual tuning order (`verdict`): data-bound, host-
bound, memory, or compute-bound, naming the flags to try. (b) and (c) are
timed by the kit's TrainingHealth (its device clock on CUDA); (a) by `clock`.
Nothing is written: no run directory, no checkpoint.
"""

import argparse
import contextlib
import json
import logging
import math
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (importing it would import torch: `bench --help` answers without)
    from .spec import Project

# Every fit of the bench: no run directory, no checkpoint, no validation, one
# line at most of its own.
QUIET = [
    "--trainer.logger=false",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--trainer.limit_val_batches=0",
    "--trainer.num_sanity_val_steps=0",
    "--checkpoint.save_top_k=0",
    "--checkpoint.save_last=false",
    "--fit_result.enabled=false",
]
# Host-bound: the full loop runs below this share of the step alone, or the step
# alone leaves the device idle between steps (the loop's own work) more than this.
HOST_BOUND_BELOW = 0.8
IDLE_BETWEEN_STEPS_ABOVE = 0.1
# Memory is the limit when a step's peak takes more than this share of the device.
MEMORY_FULL_ABOVE = 0.9


def parser(command: str = "<command>") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{command} bench",
        description="Where a training step's time goes on this machine: (a) the loader alone,"
        " (b) the step alone on a batch held on the device, (c) the full fit loop; then one"
        " verdict (data-bound, host-bound, memory, compute-bound) naming what to change.",
        epilog="Flags after `--` go to every measurement's fit, e.g. `-- --config"
        " configs/gpu.yaml --trainer.precision bf16-mixed`.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=50,
        help="training steps of (b) and (c), batches of (a) (default: %(default)s)",
    )
    parser.add_argument(
        "--batch_size",
        "--batch-size",
        default=None,
        help="the per-device batch size (--data.batch_size), or 'auto': the largest that fits"
        " the GPU's memory, found with Lightning's batch size finder (CUDA only)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    return parser


@dataclass
class Figures:
    """What the bench measured; None where it could not be measured here."""

    device: str
    precision: str
    batch_size: int | None
    steps: int
    loader_samples_per_s: float | None
    step_samples_per_s: float | None
    loop_samples_per_s: float | None
    data_wait_share: float | None
    idle_share: float | None  # of (b): the device idle between steps, nothing to load
    host_ms_per_step: float | None  # what (c) spends per step above (b)
    flops_per_step: float | None
    flops_per_s: float | None
    mfu: float | None
    peak_memory_mib: float | None
    device_memory_mib: float | None
    num_workers: int | None = None
    pin_memory: bool | None = None
    on_device: bool | None = None  # the training data sits on the device already
    compiled: bool | None = None
    batch_size_found: bool = False


def verdict(figures: Figures) -> tuple[str, str]:
    """(kind, what to do) from the figures alone, in the tuning order: data, then the
    step's compute (host-bound, then memory), then compute-bound."""
    f = figures
    on_cuda = f.device.startswith("cuda")
    step, loop, loader = f.step_samples_per_s, f.loop_samples_per_s, f.loader_samples_per_s
    if loader is not None and step is not None and loader < step:
        fixes = []
        if not f.on_device:
            if not f.num_workers:
                fixes.append("loader workers (--data.num_workers N, one per free core)")
            if on_cuda and not f.pin_memory:
                fixes.append("pinned memory (--data.pin_memory true)")
            if on_cuda:
                fixes.append("data kept on the GPU when it fits (--data.on_device true)")
        fixes.append("a lighter __getitem__ (decode and augment offline, return tensors)")
        return "data-bound", (
            f"the loader gives {loader:.0f} samples/s, the step could take {step:.0f}:"
            f" try {'; '.join(fixes)}"
        )
    idle = f.idle_share or 0.0
    slow_loop = loop is not None and step is not None and loop < HOST_BOUND_BELOW * step
    if slow_loop or idle > IDLE_BETWEEN_STEPS_ABOVE:
        fixes = ["a bigger batch (--data.batch_size, or --batch_size auto on a GPU)"]
        if not f.compiled:
            fixes.append("--compile.enabled true (fewer kernel launches)")
        if on_cuda:
            fixes.append("CUDA graphs (compile's mode reduce-overhead)")
        if slow_loop:
            extra = f" ({f.host_ms_per_step:.2f} ms a step)" if f.host_ms_per_step else ""
            found = f"the loop runs {loop:.0f} samples/s, the step alone {step:.0f}{extra}"
        else:
            found = f"the device is idle {100 * idle:.0f}% of the time between steps"
        return "host-bound", (
            f"{found}: the step is too small for the device; try {'; '.join(fixes)}"
        )
    if f.peak_memory_mib and f.device_memory_mib:
        share = f.peak_memory_mib / f.device_memory_mib
        if share > MEMORY_FULL_ABOVE:
            return "memory", (
                f"a step's peak takes {100 * share:.0f}% of the device's memory: a larger batch"
                " will not fit; accumulate instead (--trainer.accumulate_grad_batches N), or"
                " shard the model across devices"
            )
    fixes = []
    if on_cuda and f.precision in ("32-true", "32", "64-true"):
        fixes.append("mixed precision (--trainer.precision bf16-mixed)")
    if not f.compiled:
        fixes.append("--compile.enabled true")
    mfu = f" at MFU {100 * f.mfu:.3g}%" if f.mfu is not None else ""
    advice = f"try {'; '.join(fixes)}" if fixes else "the next step is more devices (DDP)"
    return "compute-bound", f"the step sets the pace{mfu}: {advice}"


def report(figures: Figures) -> str:
    f = figures

    def rate(value: float | None) -> str:
        return f"{value:.1f} samples/s" if value is not None else "not measured"

    mfu = f"MFU {100 * f.mfu:.3g}%" if f.mfu is not None else "MFU: no known peak for this device"
    flops = ""
    if f.flops_per_step:
        flops = f" | {f.flops_per_step / 1e6:.4g} MFLOP a step"
        if f.flops_per_s:
            flops += f", {f.flops_per_s / 1e9:.3g} GFLOP/s"
        flops += f" | {mfu}"
    idle = f" | idle between steps {100 * f.idle_share:.0f}%" if f.idle_share is not None else ""
    memory = f" | peak memory {f.peak_memory_mib:.0f} MiB" if f.peak_memory_mib else ""
    if f.device_memory_mib and f.peak_memory_mib:
        memory += f" of {f.device_memory_mib:.0f}"
    wait = f" | data wait {100 * f.data_wait_share:.0f}%" if f.data_wait_share is not None else ""
    host = (
        f" | host time above (b): {f.host_ms_per_step:.2f} ms a step"
        if f.host_ms_per_step is not None
        else ""
    )
    found = " (found: the largest that fits)" if f.batch_size_found else ""
    kind, advice = verdict(f)
    return "\n".join(
        [
            f"bench: {f.device}, precision {f.precision}, batch {f.batch_size}{found},"
            f" {f.steps} steps each",
            f"(a) loader alone  {rate(f.loader_samples_per_s)}"
            f" (num_workers {f.num_workers}, pin_memory {f.pin_memory},"
            f" on the device {bool(f.on_device)})",
            f"(b) step alone    {rate(f.step_samples_per_s)}{idle}{flops}{memory}",
            f"(c) full loop     {rate(f.loop_samples_per_s)}{wait}{host}",
            f"verdict: {kind}: {advice}",
        ]
    )


class Bench:
    """The three measurements of one project; `clock` times (a)."""

    clock: Callable[[], float] = staticmethod(time.perf_counter)

    def __init__(self, project: "Project", steps: int, flags: list[str]) -> None:
        self.project, self.steps, self.flags = project, steps, flags

    def build(self, *extra: str) -> Any:
        """The project's CLI, built and not run, with the bench's flags."""
        from .cli import main

        args = [*QUIET, f"--trainer.max_steps={self.steps}", *self.flags, *extra]
        return main(args, self.project, run=False)

    def loader_rate(self, loader: Any) -> tuple[float | None, int]:
        """(a): samples/s over up to `steps` batches, after the first (workers starting)."""
        from .health import batch_length

        iterator, samples, start = iter(loader), 0, None
        for index in range(self.steps + 1):
            try:
                batch = next(iterator)
            except StopIteration:
                break
            if index == 0:
                start = self.clock()
                continue
            samples += batch_length(batch)
        elapsed = self.clock() - start if start is not None else 0.0
        return (samples / elapsed if elapsed > 0 and samples else None), samples

    def run(self, batch_size: str | None) -> Figures:
        import torch
        from lightning.pytorch.utilities import move_data_to_device

        from .callbacks import find_callback, loader_facts
        from .data import TensorBatches
        from .health import TrainingHealth, batch_length
        from .internals import is_compiled

        extra = [f"--data.batch_size={batch_size}"] if batch_size not in (None, "auto") else []
        found = False
        if batch_size == "auto":
            extra, found = [f"--data.batch_size={self.largest_batch()}"], True
        # (c) the full loop, first: it sets the data up as a fit does.
        cli = self.build(*extra)
        trainer, model, data = cli.trainer, cli.model, cli.datamodule
        trainer.fit(model, datamodule=data)
        loop = find_callback(trainer, TrainingHealth).summary
        facts = loader_facts(trainer)
        loader = data.train_dataloader()
        # Sliced where the steps run: no loading, no copy (on the CPU, data in memory).
        dataset = getattr(loader, "dataset", None)
        on_device = isinstance(dataset, TensorBatches) and (
            dataset.tensors[0].device.type == trainer.strategy.root_device.type
        )
        # (a) the loader alone, as configured.
        loader_rate, _ = self.loader_rate(loader)
        # (b) the step alone: one batch, already on the device, every step.
        cli = self.build(*extra)
        trainer, model = cli.trainer, cli.model
        device = trainer.strategy.root_device
        batch = move_data_to_device(next(iter(loader)), device)
        trainer.fit(model, train_dataloaders=Held(batch, self.steps))
        step = find_callback(trainer, TrainingHealth).summary
        device_memory = None
        if device.type == "cuda":
            device_memory = torch.cuda.get_device_properties(device).total_memory / 2**20
        host_ms = None
        size = batch_length(batch)
        if loop.get("samples_per_s") and step.get("samples_per_s"):
            per_step = size / loop["samples_per_s"] - size / step["samples_per_s"]
            host_ms = max(0.0, 1000 * per_step)
        peaks = step.get("peak_memory_mib")
        return Figures(
            device=str(device),
            precision=str(trainer.precision),
            batch_size=facts.get("batch_size"),
            steps=self.steps,
            loader_samples_per_s=_rounded(loader_rate),
            step_samples_per_s=step.get("samples_per_s"),
            loop_samples_per_s=loop.get("samples_per_s"),
            data_wait_share=loop.get("data_wait_share"),
            idle_share=step.get("data_wait_share"),
            host_ms_per_step=_rounded(host_ms, 3),
            flops_per_step=step.get("flops_per_batch"),
            flops_per_s=step.get("flops_per_s"),
            mfu=step.get("mfu"),
            peak_memory_mib=max(peaks) if peaks else None,
            device_memory_mib=_rounded(device_memory),
            num_workers=facts.get("num_workers"),
            pin_memory=facts.get("pin_memory"),
            on_device=on_device,
            compiled=is_compiled(model),
            batch_size_found=found,
        )

    def largest_batch(self) -> int:
        """The largest per-device batch that fits the GPU, by Lightning's batch size finder."""
        from lightning.pytorch.tuner import Tuner

        cli = self.build()
        if cli.trainer.strategy.root_device.type != "cuda":
            raise BenchError(
                "--batch_size auto: it finds the largest batch that fits a GPU's memory, and this"
                " run is on the CPU, whose memory is not the limit; give a number instead"
            )
        if not hasattr(cli.datamodule, "batch_size"):
            raise BenchError(
                f"--batch_size auto: {type(cli.datamodule).__name__} has no batch_size"
                " attribute for Lightning's batch size finder to change"
            )
        found = Tuner(cli.trainer).scale_batch_size(
            cli.model, datamodule=cli.datamodule, mode="binsearch", steps_per_trial=3
        )
        return int(found or cli.datamodule.batch_size)


class Held:
    """The same batch, `times` times: a training loader that loads nothing."""

    def __init__(self, batch: Any, times: int) -> None:
        self.batch, self.times = batch, times

    def __iter__(self):
        return (self.batch for _ in range(self.times))

    def __len__(self) -> int:
        return self.times


class BenchError(ValueError):
    """A bench that cannot run as asked; the message says why."""


@contextlib.contextmanager
def quiet_fits():
    """The fits' own reports (environment, health, seed) would bury the bench's; and
    they validate nothing, on purpose. Levels and filters are restored after."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"You defined a `validation_step` but have no")
        warnings.filterwarnings("ignore", r"The model waited for data")  # the verdict says
        for logger in loggers:
            logger.setLevel(logging.WARNING)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)


def _rounded(value: float | None, digits: int = 1) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)


def main(argv: list[str] | None, project: "Project") -> int:
    words = sys.argv[2:] if argv is None else list(argv)
    flags: list[str] = []
    if "--" in words:
        at = words.index("--")
        words, flags = words[:at], words[at + 1 :]
    args = parser(project.command).parse_args(words)
    if args.steps < 2:
        print(
            f"error: --steps {args.steps}: must be 2 or more (the first is not timed)",
            file=sys.stderr,
        )
        return 2
    if args.batch_size not in (None, "auto") and not str(args.batch_size).isdigit():
        print(
            f"error: --batch_size {args.batch_size}: must be a positive whole number or auto",
            file=sys.stderr,
        )
        return 2
    try:
        with quiet_fits():
            figures = Bench(project, args.steps, flags).run(args.batch_size)
    except BenchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    kind, advice = verdict(figures)
    if args.json:
        print(json.dumps({**asdict(figures), "verdict": kind, "advice": advice}, indent=2))
    else:
        print(report(figures))
    return 0
