"""`predict` writes what `predict_step` returns as CSV rows, one per sample.

Any output works: a tensor, a tuple or list of tensors, or a dict of them (also
per-sample lists, such as ids). Columns are named after the dict keys, or
`output` / `output_<i>` for unnamed outputs; a value with several numbers per
sample (class probabilities) gets one column each, `<name>_<j>`. A project that
wants other columns names a function in `Project.prediction_columns`
(`outputs -> dict[str, values]`).
"""

import csv
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter


def _per_sample(name: str, value: Any) -> dict[str, list]:
    """Columns of one named output: a list of per-sample values each."""
    if not isinstance(value, torch.Tensor):
        return {name: list(value)}
    value = value.detach().cpu()
    if value.dim() == 0:
        raise ValueError(f"prediction {name!r} is a scalar, not one value per sample")
    if value.dim() == 1 or value[0].numel() == 1:
        return {name: value.reshape(len(value)).tolist()}
    flat = value.reshape(len(value), -1)
    return {f"{name}_{j}": flat[:, j].tolist() for j in range(flat.shape[1])}


def prediction_columns(outputs: Any) -> dict[str, list]:
    """The CSV columns for one batch of `predict_step` outputs."""
    if isinstance(outputs, Mapping):
        named = outputs.items()
    elif isinstance(outputs, Sequence) and not isinstance(outputs, str | torch.Tensor):
        named = ((f"output_{i}", value) for i, value in enumerate(outputs))
    else:
        named = [("output", outputs)]
    columns: dict[str, list] = {}
    for name, value in named:
        columns.update(_per_sample(str(name), value))
    lengths = {name: len(values) for name, values in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"predictions have different numbers of samples per column: {lengths}")
    return columns


class PredictionWriter(BasePredictionWriter):
    """Writes `predict`'s outputs to a CSV file, a row a sample.

    Each row holds the sample's index in the predict set, then one column per output
    (see the module docstring).

    Under DDP every rank writes its own share, `<stem>.rank<R>.csv`; the indices say
    where each row belongs.

    Args:
        output: the CSV file to write.
        columns: `Project.prediction_columns`, a function `outputs -> {column: values}`;
            None: the kit's own columns (the CLI gives it).
    """

    def __init__(
        self,
        output: str = "predictions.csv",
        columns: Callable[[Any], Mapping[str, Any]] | None = None,
    ) -> None:
        super().__init__(write_interval="epoch")
        self.output = output
        self.columns = columns  # Project.prediction_columns; None: the kit's own columns
        self._line: str | None = None  # what was written, said as predict ends

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
        own_columns = self.columns
        header: list[str] | None = None
        rows = []
        for outputs, indices in zip(predictions, batch_indices[0], strict=True):
            columns = prediction_columns(own_columns(outputs) if own_columns else outputs)
            header = header or list(columns)
            rows += [[i, *row] for i, *row in zip(indices, *columns.values(), strict=True)]
        path = self.path(trainer)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["index", *(header or [])])
            writer.writerows(sorted(rows))
        shared = ""
        if trainer.world_size > 1:
            shared = f" (this process's share: each of the {trainer.world_size} writes its own)"
        columns = "".join(f", {name}" for name in header or [])
        self._line = f"Wrote {len(rows)} predictions to {path}{shared}, columns: index{columns}"

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Printed last, after the progress bar: the line that says what `predict` made.
        line, self._line = self._line, None
        if line and trainer.is_global_zero:
            print(line, file=sys.stderr)
