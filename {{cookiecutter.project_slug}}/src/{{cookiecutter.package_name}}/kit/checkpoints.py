"""Checkpoints that survive faults: resume from the newest, save when stopped, load safely.

- `fit --ckpt_path last` continues the newest run under the logger's directory
  (or the run named by the logger's `version`), from whichever is newest of its
  `last.ckpt` (end of an epoch), `interrupted.ckpt` (written when a scheduler's
  SIGTERM or Ctrl-C stopped it) and SLURM's `hpc_ckpt_N.ckpt` (in the trainer's
  `default_root_dir`), and logs into the same directory.
  With nothing to resume it starts afresh, so the same command serves the
  first start and every restart of a cluster job.
- `check_checkpoint` refuses a truncated or corrupted file with a message that
  names it, before anything unpickles it.
"""

import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from {{ cookiecutter.package_name }}.kit.runs import continue_run, run_candidates

RESUMABLE = ("last.ckpt", "interrupted.ckpt")
# Checking every byte's CRC costs about a second a GB; above this, only the structure.
CRC_CHECK_MAX_BYTES = 2 * 1024**3


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used; the message names it and says why."""


def check_checkpoint(path: str | Path) -> Path:
    """`path` as a Path if it is a complete checkpoint file, else CheckpointError.

    torch.save writes a zip archive whose index is at the very end: a file cut
    short (a copy or a save that was killed) has none, and a damaged byte fails
    its member's CRC.
    """
    file = Path(path)
    if not file.is_file():
        raise CheckpointError(f"checkpoint '{file}' does not exist or is not a file")
    size = file.stat().st_size
    advice = "use another checkpoint (the best-*.ckpt or last.ckpt beside it) or copy it again"
    if not zipfile.is_zipfile(file):
        raise CheckpointError(
            f"checkpoint '{file}' ({size} bytes) is truncated or not a PyTorch checkpoint:"
            f" it has no zip index at its end; {advice}"
        )
    if size <= CRC_CHECK_MAX_BYTES:
        try:
            with zipfile.ZipFile(file) as archive:
                damaged = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as error:
            damaged = f"? ({error})"
        if damaged is not None:
            raise CheckpointError(
                f"checkpoint '{file}' is corrupted: its member {damaged} fails the CRC check;"
                f" {advice}"
            )
    return file


def newest_resumable(runs: Iterable[Path], root: Path | None = None) -> Path | None:
    """The most recently written `last.ckpt` or `interrupted.ckpt` in `runs`, or
    `hpc_ckpt_N.ckpt` in `root` (what Lightning saves when SLURM preempts a job)."""
    files = [run / "checkpoints" / name for run in runs for name in RESUMABLE]
    files = [file for file in files if file.is_file()]
    if root is not None:
        files += root.glob("hpc_ckpt_*.ckpt")
    return max(files, key=lambda file: file.stat().st_mtime, default=None)


def resolve_last(config: dict[str, Any]) -> Path | None:
    """Turn `ckpt_path: last` in a subcommand's config into the newest checkpoint.

    Also points the logger at that checkpoint's run, so logs, config and new
    checkpoints continue in the same directory. Returns the checkpoint, or None
    (nothing to resume: Lightning then warns and starts afresh).
    """
    logger = config.get("trainer", {}).get("logger")
    if config.get("ckpt_path") != "last":
        return None
    root = Path(config["trainer"].get("default_root_dir") or ".")
    found = newest_resumable(run_candidates(logger), root)
    if found is None:
        return None
    config["ckpt_path"] = str(found)
    if found.parent.name == "checkpoints":  # not an hpc checkpoint: continue its run
        continue_run(logger, found.parent.parent)
    rank_zero_info(f"Resuming from {found} (the newest of {', '.join(RESUMABLE)}, hpc_ckpt_*)")
    return found


class BestAndLast(ModelCheckpoint):
    """ModelCheckpoint whose `last.ckpt` is rewritten at every epoch's end.

    Lightning 2.6 rewrites `last.ckpt` only when a top-k checkpoint is saved
    too, so after an epoch that did not improve, `last` is an epoch behind
    and a resume would redo it. Here `last` is always the latest state.
    """

    def _save_last_regardless(self, trainer: Trainer) -> None:
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._save_last_regardless(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._save_last_regardless(trainer)


class InterruptCheckpoint(Callback):
    """Writes `interrupted.ckpt` beside the other checkpoints when the run is stopped.

    Only for SIGTERM (what SLURM, Kubernetes and other schedulers send before
    they kill a job) and Ctrl-C: every rank receives those, so all ranks save
    together. A crash on one rank does not save: the other ranks are elsewhere
    and a collective save would wait for them forever. Removed again when a
    run finishes normally.
    """

    FILENAME = "interrupted.ckpt"

    def _path(self, trainer: Trainer) -> Path | None:
        callback = trainer.checkpoint_callback
        dirpath = getattr(callback, "dirpath", None)
        return Path(dirpath) / self.FILENAME if dirpath else None

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        path = self._path(trainer)
        if path is None or not isinstance(exception, (SIGTERMException, KeyboardInterrupt)):
            return
        if trainer.global_step == 0:  # not a step taken: nothing to resume
            return
        # The full training state, to resume from (weights_only is for loading).
        trainer.save_checkpoint(path, weights_only=False)
        rank_zero_info(f"Stopped: saved {path}; continue with `fit --ckpt_path last`")

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        path = self._path(trainer)
        if trainer.is_global_zero and path is not None and path.exists():
            path.unlink()


class ResumeCheck(Callback):
    """Says so when a resumed run had nothing left to do, and how to continue it."""

    def __init__(self) -> None:
        self._stepped = False

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._stepped = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self._stepped = True

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.ckpt_path or self._stepped:
            return
        if trainer.max_epochs is not None and trainer.current_epoch >= trainer.max_epochs:
            rank_zero_info(
                f"{trainer.ckpt_path} is from a finished run: it already trained"
                f" {trainer.current_epoch} epochs (max_epochs={trainer.max_epochs}). To train"
                f" it further, raise --trainer.max_epochs (e.g. {2 * trainer.max_epochs})."
            )
        elif trainer.max_steps not in (None, -1) and trainer.global_step >= trainer.max_steps:
            rank_zero_info(
                f"{trainer.ckpt_path} is from a finished run: it already took"
                f" {trainer.global_step} steps (max_steps={trainer.max_steps}). To train it"
                " further, raise --trainer.max_steps."
            )
