"""What a run shows as it trains: the model summary, `train/loss` and the progress (a bar
in a terminal, a line an epoch elsewhere).

Each costs the steps nothing a GPU would wait for. `train/loss` is read from
the device once per logging window, never in the steps between; the bar is
redrawn a few times a second, whatever a step takes; the summary counts no
FLOPs it cannot know (the health report counts them on the first step).
"""

import logging
import math
import sys
from time import monotonic
from typing import Any

import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelSummary, ProgressBar, TQDMProgressBar

from .internals import accumulating, format_summary_table, loggers_write_now, logging_step
from .watch import check_loss, returned_loss

log = logging.getLogger("lightning.pytorch.callbacks.model_summary")


def logs_this_step(trainer: Trainer) -> bool:
    """Whether the logger writes at the end of this training step: an optimizer
    step (not a micro-batch being accumulated) at which the logger connector
    writes (every `--trainer.log_every_n_steps`, and the last)."""
    return not accumulating(trainer) and loggers_write_now(trainer)


class TrainLoss(Callback):
    """Logs `train/loss`: the mean training loss over each logging window.

    Each step's loss stays on the device. On the steps the logger writes
    (every `--trainer.log_every_n_steps`) the window's mean over every rank is
    read once, as one number (a loss that is no longer finite stops the run
    there: kit/watch.py), and shown where `self.log(..., prog_bar=True)` would show it:
    on the progress bar and in `trainer.callback_metrics`, which checkpoints
    and early stopping monitor. The loggers receive the numbers in groups,
    every `write_every` seconds and at each epoch's end, each at its own step.
    Between logging steps the kit adds no work. It reads the loss that
    `training_step` returns, so any module gets the curve; one that logs
    `train/loss` itself keeps its own.

    Why not `self.log`: it costs about a millisecond of host time a call
    (Lightning moves its whole record of the metric to the value's device each
    time), flushes every logger, and a device tensor on the bar is read from the
    device on every later step; and TensorBoard's writer thread costs more per
    point written alone than per point written in a group.

    Args:
        write_every: seconds between the loggers' writes of the points gathered (and
            at each epoch's end); the points keep their own steps.
    """

    NAME = "train/loss"
    FOLD = 64  # losses kept before they are summed into one: a window's memory stays small
    clock = staticmethod(monotonic)

    def __init__(self, write_every: float = 10.0) -> None:
        self.write_every = write_every
        self._written_at = -float("inf")
        self._losses: list[torch.Tensor] = []  # this window's, on the device
        self._count = 0  # steps in this window
        # (step, epoch, mean) not yet with the loggers
        self._pending: list[tuple[int, int, float]] = []
        self._module_logs_it: bool | None = None
        self._carried = 0.0  # the window's sum before a resume (its count is in _count)
        self._strategy: Any = None  # where the ranks' sums meet, with several
        self._first = 0  # the window's first step
        self._last_finite: tuple[float, str] | None = None

    def on_train_start(self, trainer: Trainer, pl_module) -> None:
        self._strategy = trainer.strategy if trainer.world_size > 1 else None
        self._first = logging_step(trainer)
        self._last_finite = None

    def _window_sum(self) -> torch.Tensor:
        """The open window's sum, averaged over the ranks: the same on every rank."""
        total = torch.stack(self._losses).sum(dtype=torch.float32)
        if self._strategy is not None:
            total = self._strategy.reduce(total, reduce_op="mean")
        return total

    def on_train_batch_end(self, trainer: Trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not trainer.log_every_n_steps:
            return
        loss = returned_loss(outputs)
        if loss is None:
            return
        if self._module_logs_it is None:
            self._module_logs_it = self.NAME in trainer.callback_metrics
        if self._module_logs_it:  # its curve is the module's; the kit checks this step's loss
            if logs_this_step(trainer):
                self._losses = [loss]  # (divided by the accumulated batches, as below)
                value = self._window_sum().item() * trainer.accumulate_grad_batches  # one read
                self._losses, window = [], f"step {logging_step(trainer)}"
                last = self._last_finite
                check_loss(trainer, pl_module, "the training loss", value, window, last)
                if math.isfinite(value):
                    self._last_finite = (value, window)
            return
        self._losses.append(loss)  # already detached by Lightning
        self._count += 1
        if len(self._losses) >= self.FOLD:
            self._losses = [torch.stack(self._losses).sum(dtype=torch.float32)]
        if logs_this_step(trainer):
            # Lightning divides the loss it hands over by the accumulated batches.
            total = self._window_sum().item() + self._carried  # the one read
            mean = total * trainer.accumulate_grad_batches / self._count
            self._losses, self._count, self._carried = [], 0, 0.0
            # Lightning's x-axis for a step's metrics: the optimizer steps before this one.
            step = logging_step(trainer)
            window = f"steps {self._first}-{step}"
            check_loss(trainer, pl_module, self.NAME, mean, window, self._last_finite)
            if math.isfinite(mean):
                self._last_finite = (mean, window)
            self._first = step + 1
            trainer.callback_metrics[self.NAME] = torch.tensor(mean)
            trainer.progress_bar_metrics[self.NAME] = mean
            self._pending.append((step, trainer.current_epoch, mean))
            if self.clock() - self._written_at >= self.write_every:
                self.write(trainer)

    # The open window goes into checkpoints, so a resumed run logs the same curve
    # (read from the device only when a checkpoint is saved, which every rank does).
    def state_dict(self) -> dict[str, Any]:
        if not self._count:
            return {}
        total = float(self._window_sum()) if self._losses else 0.0
        return {"sum": total + self._carried, "count": self._count}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._losses = []
        self._carried = float(state_dict.get("sum", 0.0))
        self._count = int(state_dict.get("count", 0))

    def write(self, trainer: Trainer) -> None:
        """Hand the pending numbers to the loggers, and have them flush."""
        self._written_at = self.clock()
        if not self._pending:
            return
        for logger in trainer.loggers:
            for step, epoch, mean in self._pending:
                logger.log_metrics({self.NAME: mean, "epoch": epoch}, step=step)
            logger.save()
        self._pending.clear()

    # Written before validation logs its own (so a metrics file stays in step order),
    # at each epoch's end, and when the run stops.
    def on_validation_start(self, trainer: Trainer, pl_module) -> None:
        self.write(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module) -> None:
        self.write(trainer)

    def on_train_end(self, trainer: Trainer, pl_module) -> None:
        self.write(trainer)

    def on_exception(self, trainer: Trainer, pl_module, exception: BaseException) -> None:
        self.write(trainer)


class TQDMBar(TQDMProgressBar):
    """Lightning's tqdm progress bar, redrawn at most every `interval` seconds.

    Each redraw reads the logged metrics and writes to the terminal, which costs
    more than a small model's whole step; Lightning redraws every
    `refresh_rate` batches, a count that either freezes a slow step's bar or
    redraws a fast one hundreds of times a second. A time interval suits both.
    The last batch of each loop is always drawn. (Kept: TQDMProgressBar's
    `refresh_rate` counts batches and has no time interval.)
    """

    clock = staticmethod(monotonic)

    def __init__(self, interval: float = 0.5, process_position: int = 0, leave: bool = False):
        super().__init__(refresh_rate=1, process_position=process_position, leave=leave)
        self.interval = interval
        self._drawn_at = -float("inf")

    def get_metrics(self, trainer, pl_module) -> dict[str, Any]:
        # The logger's version says nothing the run directory does not (the fit's last
        # line names it), and a W&B or MLflow one is a long id.
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics

    def _due(self, batch_idx: int, total: float) -> bool:
        """Whether to redraw after `batch_idx` of `total`: the interval passed, or the last."""
        now = self.clock()
        if now - self._drawn_at >= self.interval or batch_idx + 1 == total:
            self._drawn_at = now
            return True
        return False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._due(batch_idx, self.total_train_batches):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args) -> None:
        if self._due(batch_idx, self.total_val_batches_current_dataloader):
            super().on_validation_batch_end(trainer, pl_module, outputs, batch, batch_idx, *args)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args) -> None:
        if self._due(batch_idx, self.total_test_batches_current_dataloader):
            super().on_test_batch_end(trainer, pl_module, outputs, batch, batch_idx, *args)

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args) -> None:
        if self._due(batch_idx, self.total_predict_batches_current_dataloader):
            super().on_predict_batch_end(trainer, pl_module, outputs, batch, batch_idx, *args)


class EpochLines(ProgressBar):
    """The progress where no terminal shows a bar: a line an epoch, in a log or a pipe.

    Each line has the metrics a bar would show. It is printed once the epoch's hooks
    have all run (the LightningModule's `on_train_epoch_end` after the callbacks'), at
    the next epoch's start or the training's end; an epoch longer than `interval`
    seconds also gets a line as it goes, so a job's log shows a long epoch moving.
    """

    clock = staticmethod(monotonic)

    def __init__(self, interval: float = 60.0) -> None:
        super().__init__()
        self.interval = interval
        self._enabled = True
        self._ended: int | None = None  # an epoch whose line is due
        self._shown_at = -float("inf")

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    def get_metrics(self, trainer, pl_module) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)  # as TQDMBar: the run directory names it
        return metrics

    def _say(self, trainer: Trainer, epoch: int, where: str = "") -> None:
        shown = [
            f"{name} {value:.4g}" if isinstance(value, float) else f"{name} {value}"
            for name, value in self.get_metrics(trainer, trainer.lightning_module).items()
        ]
        print(f"Epoch {epoch}{where}: {' | '.join(shown)}", file=sys.stderr)
        self._shown_at = self.clock()

    def on_train_epoch_start(self, trainer: Trainer, pl_module) -> None:
        self._shown_at = self.clock()
        if self._ended is not None and self._enabled:
            self._say(trainer, self._ended)
        self._ended = None

    def on_train_batch_end(self, trainer: Trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._enabled and self.clock() - self._shown_at >= self.interval:
            total = trainer.num_training_batches
            of = f"/{total}" if total != float("inf") else ""
            self._say(trainer, trainer.current_epoch, f", batch {batch_idx + 1}{of}")

    def on_train_epoch_end(self, trainer: Trainer, pl_module) -> None:
        self._ended = trainer.current_epoch

    def on_train_end(self, trainer: Trainer, pl_module) -> None:
        if self._ended is not None and self._enabled:
            self._say(trainer, self._ended)
        self._ended = None


class Summary(ModelSummary):
    """Lightning's model summary, without a FLOPs column of zeros.

    Lightning counts a layer's FLOPs only for a module with an
    `example_input_array`; without one it shows zeros and `Total FLOPs: 0`. The
    health report counts a whole training step's FLOPs on the first step.
    """

    @staticmethod
    def summarize(
        summary_data, total_parameters, trainable_parameters, model_size, modes, total_flops, **_
    ) -> None:
        if not total_flops:
            summary_data = [column for column in summary_data if column[0] != "FLOPs"]
        table = format_summary_table(
            total_parameters, trainable_parameters, model_size, modes, total_flops, *summary_data
        )
        if not total_flops:
            table = table.rsplit("\n", 1)[0]  # its last line: "0  Total Flops"
        log.info("\n" + table)
