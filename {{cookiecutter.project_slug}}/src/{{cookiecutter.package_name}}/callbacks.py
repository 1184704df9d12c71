"""Callbacks that tell you what the run is really doing.

`EnvironmentReport` prints, once on rank 0 when fit starts, everything that
decides where and how fast the run goes: versions and build of torch, the GPUs
(the free memory of its own), accelerator, strategy, world size, precision, batch
sizes and loader settings. A wrong line here (a CPU build of torch, one device
where you asked for eight) is cheaper to spot than a slow week.
"""

import csv
from collections.abc import Sequence
from itertools import chain
from pathlib import Path
from typing import Any

import lightning
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities import rank_zero_info

from {{ cookiecutter.package_name }}.doctor import build_name, cuda_devices
from {{ cookiecutter.package_name }}.hints import RUN_CONTEXT


def torch_build() -> str:
    """What this torch was compiled for: 'CUDA 12.4', 'ROCm 6.1' or 'CPU-only'."""
    return build_name(torch.version.cuda, getattr(torch.version, "hip", None))


def batch_sizes(trainer: Trainer) -> tuple[int | None, int | None]:
    """(per-device batch size, x accumulation x world size), or Nones without a batch size."""
    batch_size = getattr(getattr(trainer, "datamodule", None), "batch_size", None)
    if not batch_size:
        return None, None
    return batch_size, batch_size * trainer.accumulate_grad_batches * trainer.world_size


def collect_environment(trainer: Trainer) -> dict[str, Any]:
    """The facts of the report, as plain values (tests and scripts read these)."""
    batch_size, effective = batch_sizes(trainer)
    loader = getattr(getattr(trainer, "datamodule", None), "loader_settings", None)
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
        "batch_size": batch_size,
        "accumulate_grad_batches": trainer.accumulate_grad_batches,
        "effective_batch_size": effective,
        "num_workers": getattr(loader, "num_workers", None),
        "pin_memory": getattr(loader, "pin_memory", None),
        "persistent_workers": getattr(loader, "persistent_workers", None),
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
    """Prints the environment report on rank 0 when fit starts."""

    def __init__(self) -> None:
        self.facts: dict[str, Any] = {}

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
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
            batch_size=batch_sizes(trainer)[0],
            cuda_device_count=torch.cuda.device_count(),
        )

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


class PredictionWriter(BasePredictionWriter):
    """`predict` writes its outputs to a CSV file: the sample's index in the
    predict set, then the model's `prediction_columns` (for the digits model:
    predicted class and its probability).

    `--predictions.output` sets the file (default `predictions.csv`). Under DDP
    every rank writes its own share, `<stem>.rank<R>.csv`; the indices say
    where each row belongs.
    """

    def __init__(self, output: str = "predictions.csv") -> None:
        super().__init__(write_interval="epoch")
        self.output = output

    def path(self, trainer: Trainer) -> Path:
        path = Path(self.output)
        if trainer.world_size > 1:
            path = path.with_name(f"{path.stem}.rank{trainer.global_rank}{path.suffix}")
        return path

    def write_on_epoch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        predictions: Sequence[Any],
        batch_indices: Sequence[Any],
    ) -> None:
        # `batch_indices` is per dataloader, then per batch; `predictions` is per
        # batch when there is one dataloader.
        if len(batch_indices) != 1:
            raise ValueError(f"one predict dataloader can be written, not {len(batch_indices)}")
        columns = None
        rows = []
        for outputs, indices in zip(predictions, batch_indices[0], strict=True):
            named = pl_module.prediction_columns(outputs)
            columns = columns or list(named)
            values = [column.detach().cpu().tolist() for column in named.values()]
            rows += [[index, *row] for index, *row in zip(indices, *values, strict=True)]
        path = self.path(trainer)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["index", *(columns or [])])
            writer.writerows(sorted(rows))
        rank_zero_info(f"Wrote {len(rows)} predictions to {path}")
