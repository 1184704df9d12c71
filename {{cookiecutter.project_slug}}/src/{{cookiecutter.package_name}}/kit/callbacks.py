"""Callbacks that tell you what the run is really doing.

`EnvironmentReport` prints, once on rank 0 when training starts, everything that
decides where and how fast the run goes: versions and build of torch, the GPUs
(the free memory of its own), accelerator, strategy, world size, precision, batch
sizes and loader settings. A wrong line here (a CPU build of torch, one device
where you asked for eight) is cheaper to spot than a slow week. Batch size and
loader settings are read from the training DataLoader itself, so they are shown
for any DataModule.
"""

from collections.abc import Mapping
from itertools import chain
from typing import Any

import lightning
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar, TQDMProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import _RICH_AVAILABLE
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from {{ cookiecutter.package_name }}.kit.doctor import build_name, cuda_devices
from {{ cookiecutter.package_name }}.kit.hints import RUN_CONTEXT


def torch_build() -> str:
    """What this torch was compiled for: 'CUDA 12.4', 'ROCm 6.1' or 'CPU-only'."""
    return build_name(torch.version.cuda, getattr(torch.version, "hip", None))


def train_loader(trainer: Trainer) -> DataLoader | None:
    """The training DataLoader once the fit loop built it (the first, if there are several)."""
    try:
        loaders = trainer.train_dataloader
    except AttributeError:  # no fit loop data yet
        return None
    if isinstance(loaders, dict):
        loaders = next(iter(loaders.values()), None)
    elif isinstance(loaders, list | tuple):
        loaders = loaders[0] if loaders else None
    return loaders if isinstance(loaders, DataLoader) else None


def loader_facts(trainer: Trainer) -> dict[str, Any]:
    """Batch size (per device and effective) and loader settings of the training DataLoader."""
    loader = train_loader(trainer)
    if loader is None:
        return dict.fromkeys(
            (
                "batch_size",
                "effective_batch_size",
                "num_workers",
                "pin_memory",
                "persistent_workers",
            )
        )
    batch_size = loader.batch_size or getattr(loader.batch_sampler, "batch_size", None)
    effective = None
    if batch_size:
        effective = batch_size * trainer.accumulate_grad_batches * trainer.world_size
    return {
        "batch_size": batch_size,
        "effective_batch_size": effective,
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "persistent_workers": loader.persistent_workers,
    }


def collect_environment(trainer: Trainer) -> dict[str, Any]:
    """The facts of the report, as plain values (tests and scripts read these)."""
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    device = trainer.strategy.root_device
    return {
        "torch": torch.__version__,
        "torch_build": torch_build(),
        "lightning": lightning.__version__,
        "cuda_available": torch.cuda.is_available(),
        "cudnn": cudnn,
        # Free memory of this rank's own device only: asking another device
        # would open a CUDA context on it, memory taken from its own rank.
        "gpus": cuda_devices(free_of={device.index or 0} if device.type == "cuda" else ()),
        "accelerator": type(trainer.accelerator).__name__,
        "strategy": type(trainer.strategy).__name__,
        "devices": trainer.num_devices,
        "num_nodes": trainer.num_nodes,
        "world_size": trainer.world_size,
        "precision": trainer.precision,
        "matmul_precision": torch.get_float32_matmul_precision(),
        "accumulate_grad_batches": trainer.accumulate_grad_batches,
        **loader_facts(trainer),
    }


def format_environment(facts: dict[str, Any]) -> str:
    """One compact block, a few `key: value` pairs a line."""
    lines = [
        f"torch {facts['torch']} ({facts['torch_build']}) | lightning {facts['lightning']}"
        f" | cuDNN {facts['cudnn'] or 'none'} | CUDA available: {facts['cuda_available']}",
    ]
    lines += [
        f"GPU {g['index']}: {g['name']} | {g['free_gib']} GiB free of {g['total_gib']} GiB"
        if g["free_gib"] is not None
        else f"GPU {g['index']}: {g['name']} | {g['total_gib']} GiB"
        for g in facts["gpus"]
    ]
    lines.append(
        f"accelerator: {facts['accelerator']} | strategy: {facts['strategy']}"
        f" | devices {facts['devices']} x nodes {facts['num_nodes']}"
        f" = world size {facts['world_size']}"
    )
    lines.append(f"precision: {facts['precision']} | float32 matmul: {facts['matmul_precision']}")
    if facts["batch_size"] is not None:
        lines.append(
            f"batch: {facts['batch_size']} per device x {facts['accumulate_grad_batches']}"
            f" accumulated x {facts['world_size']} ranks"
            f" = {facts['effective_batch_size']} effective"
        )
    if facts["num_workers"] is not None:
        lines.append(
            f"loader: num_workers {facts['num_workers']} | pin_memory {facts['pin_memory']}"
            f" | persistent_workers {facts['persistent_workers']}"
        )
    width = max(len(line) for line in lines)
    rule = "-" * min(width, 100)
    return "\n".join(["Environment", rule, *lines, rule])


class EnvironmentReport(Callback):
    """Prints the environment report on rank 0 when training starts."""

    def __init__(self) -> None:
        self.facts: dict[str, Any] = {}

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.is_global_zero:  # one report per run; no communication needed
            self.facts = collect_environment(trainer)
            rank_zero_info(format_environment(self.facts))


class FailureContext(Callback):
    """Keeps what the error hints quote: the run's settings, and where the
    module's tensors were when a step failed (before Lightning moves them back)."""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        RUN_CONTEXT.update(
            precision=trainer.precision,
            devices=trainer.num_devices,
            accumulate_grad_batches=trainer.accumulate_grad_batches,
            cuda_device_count=torch.cuda.device_count(),
        )

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        batch_size = loader_facts(trainer)["batch_size"]
        if batch_size:
            RUN_CONTEXT["batch_size"] = batch_size

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        where: dict[str, list[str]] = {}
        for name, tensor in chain(pl_module.named_parameters(), pl_module.named_buffers()):
            where.setdefault(str(tensor.device), []).append(name)
        RUN_CONTEXT["tensor_devices"] = {
            device: names[:4] + ([f"... {len(names) - 4} more"] if len(names) > 4 else [])
            for device, names in where.items()
        }


def logs_this_step(trainer: Trainer) -> bool:
    """Whether the logger writes at the end of this training step (the logger
    connector's own rule: every `--trainer.log_every_n_steps`, and the last)."""
    connector = getattr(trainer, "_logger_connector", None)
    return bool(getattr(connector, "should_update_logs", True))


class TrainLoss(Callback):
    """Logs `train/loss`: the mean training loss over each logging window.

    Each step's loss is added to a sum kept on the device (no host sync), and
    the mean is logged once per `--trainer.log_every_n_steps`, on the steps the
    logger writes: a smoother curve than one batch's loss, for a fraction of
    the cost of logging every step. The progress bar shows the same mean. It
    reads the loss that `training_step` returns, so any module gets the curve;
    one that logs `train/loss` itself keeps its own.
    """

    NAME = "train/loss"

    def __init__(self) -> None:
        self._sum: torch.Tensor | None = None
        self._count = 0
        self._module_logs_it: bool | None = None

    def on_train_batch_end(self, trainer: Trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if not isinstance(loss, torch.Tensor):
            return
        if self._module_logs_it is None:
            self._module_logs_it = self.NAME in trainer.callback_metrics
        if self._module_logs_it:
            return
        loss = loss.detach()
        self._sum = loss if self._sum is None else self._sum + loss
        self._count += 1
        if logs_this_step(trainer):
            pl_module.log(self.NAME, self._sum / self._count, prog_bar=True)
            self._sum, self._count = None, 0


class _NewMetricsOnly:
    """A progress bar that reads the logged metrics only when there are new ones.

    Lightning's bars read them after every training step and turn each tensor
    into a float with `.item()`: on a GPU, the host waits for the device every
    step and cannot queue the next step's work ahead. Here the bar reads them
    again only after a step at which the logger wrote (every
    `--trainer.log_every_n_steps`), and at epoch ends and in validation as
    usual; in between it shows the values read last. `train/loss` changes only
    on those steps anyway; a value your module logs to the bar every step is
    shown as of the last logging step.
    """

    _in_step = False
    _new = True  # a logging step passed since the bar last read the metrics
    _shown: dict | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not trainer.log_every_n_steps or logs_this_step(trainer):
            self._new = True
        self._in_step = True
        try:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        finally:
            self._in_step = False

    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
        if self._in_step and self._shown is not None and not self._new:
            return self._shown
        self._shown = super().get_metrics(trainer, pl_module)
        self._new = False
        return self._shown


class RichBar(_NewMetricsOnly, RichProgressBar):
    """Lightning's rich progress bar, reading metrics only when they are new."""


class TQDMBar(_NewMetricsOnly, TQDMProgressBar):
    """Lightning's tqdm progress bar, reading metrics only when they are new."""


def progress_bar() -> ProgressBar:
    """The bar Lightning would pick (rich if installed, else tqdm), in its
    new-metrics-only form."""
    return RichBar() if _RICH_AVAILABLE else TQDMBar()
