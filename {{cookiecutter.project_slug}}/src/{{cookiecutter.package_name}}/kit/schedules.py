"""Learning-rate schedules built for a fixed number of steps, and fits that take more.

A schedule such as torch's OneCycleLR is built for `total_steps` (usually the
Trainer's `estimated_stepping_batches`, when `configure_optimizers` runs) and
raises at the first step past them. A checkpoint keeps that number and the
steps taken: a run continued with more epochs (`fit --ckpt_path last
--trainer.max_epochs 40`) would train to the schedule's end, then stop with a
traceback. `ScheduleLength` refuses such a fit in one line as its training
starts, and `ending_schedules` tells the closing line not to offer that
continuation. Imports Lightning and the kit's spec.
"""

import math

from lightning.pytorch import Callback, LightningModule, Trainer

from .spec import ConfigError


def steps_left(trainer: Trainer, interval: str) -> float:
    """The scheduler steps of `interval` ("step": optimizer steps; "epoch") this fit has
    yet to take, from where it starts; inf where nothing bounds them."""
    epochs = trainer.max_epochs if trainer.max_epochs not in (None, -1) else math.inf
    epochs_left = max(0, epochs - trainer.current_epoch)  # this one included
    if interval == "epoch":
        return epochs_left
    left = math.inf
    if trainer.max_steps not in (None, -1):
        left = max(0, trainer.max_steps - trainer.global_step)
    batches = trainer.num_training_batches  # an epoch's, as limited
    if math.isfinite(epochs_left) and math.isfinite(batches):
        per_epoch = math.ceil(batches / trainer.accumulate_grad_batches)
        # Batches done in this epoch: only in one resumed half-way. (A checkpoint of an
        # epoch's last batch counts that epoch done already, and its batches too.)
        loop = trainer.fit_loop
        done = loop.epoch_loop.batch_progress.current.processed if loop.restarted_mid_epoch else 0
        done = done if done < batches else 0
        this_epoch = max(0, per_epoch - done // trainer.accumulate_grad_batches)
        left = min(left, this_epoch + per_epoch * (epochs_left - 1) if epochs_left else 0)
    return left


def ending_schedules(trainer: Trainer) -> list[tuple[str, int, float]]:
    """(name, steps it has left, steps the fit has left) of each schedule of a fixed length
    (a `total_steps`) that the fit would take to its end or past it."""
    found = []
    for config in trainer.lr_scheduler_configs:
        total = getattr(config.scheduler, "total_steps", None)
        if not isinstance(total, int):
            continue
        has = total - config.scheduler.last_epoch  # steps taken, restored by a resume
        takes = steps_left(trainer, config.interval) / config.frequency
        if takes >= has:
            found.append((type(config.scheduler).__name__, has, takes))
    return found


class ScheduleLength(Callback):
    """Refuses, in one line as training starts, a fit that takes more steps than a
    schedule of a fixed length has left (it would fail at the first step past them)."""

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        for name, has, takes in ending_schedules(trainer):
            if takes <= has or not math.isfinite(takes):  # (a stream of no known length)
                continue
            way = (
                "continue it with the --trainer.max_epochs it was trained for, or train"
                " further in a new run"
                if trainer.ckpt_path
                else "build it from self.trainer.estimated_stepping_batches"
            )
            raise ConfigError(
                f"{name} has {has} steps left and this fit takes {takes:g}: it cannot step"
                f" past its last; {way}"
            )
