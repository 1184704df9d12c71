"""Checkpoints that survive faults: written whole, resumed from the newest intact one,
saved when stopped, loaded safely.

- Every checkpoint is written atomically in its own directory (`atomic_save`,
  through the Trainer's `AtomicCheckpointIO`): a temporary file beside it,
  flushed to disk, renamed over the old one. A kill, a power loss or a full
  disk leaves the previous file as it was, never a partial one.
- `fit --ckpt_path last` continues the newest run under the logger's directory
  (or the run named by the logger's `version`), from the newest intact file of
  its `last.ckpt` (end of an epoch), `interrupted.ckpt` (written when a
  scheduler's SIGTERM, SLURM's SIGUSR1 or Ctrl-C stopped it), `hpc_ckpt_N.ckpt`
  (Lightning's own SLURM saves, in the trainer's `default_root_dir`) and its
  `best-*.ckpt`; a damaged one is named and skipped. With nothing to resume it
  starts afresh, so the same command serves the first start and every restart
  of a cluster job.
- A save does not stall training (`BackgroundWriter`): the step copies the state
  into host memory and goes on; a thread of its own writes it, one save at a
  time, and a failed write stops the run at the next step. `--checkpoint.async
  false` writes in the step instead.
- `check_checkpoint` refuses a truncated or corrupted file with a message that
  names it, before anything unpickles it.
"""

import copy
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import IO, Any, cast
from weakref import proxy

import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import nn

from .callbacks import keep_context
from .internals import (
    DCP_METADATA,
    accumulating,
    before_each_step_stop_check,
    forget_step_saved,
    last_saved,
    monitor_candidates,
    note_saved,
    on_sigterm_in_fit,
    request_stop,
    saves_at_train_epoch_end,
    skips_saving,
)
from .runs import continue_run, is_first_process, run_candidates
from .spec import init_parameters

RESUMABLE = ("last.ckpt", "interrupted.ckpt")
PARTIAL = ".partial"  # the suffix of a checkpoint being written
COMMITTED = "COMMITTED"  # written last into a sharded checkpoint folder: it is complete
PARTIAL_FOLDER = ".partial"  # the suffix of a folder being written
OLD_FOLDER = ".old"  # the previous folder, for the moment between two renames
# Checking every byte's CRC costs about a second a GB; above this, only the structure.
CRC_CHECK_MAX_BYTES = 2 * 1024**3


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used; the message names it and says why."""


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written; the message names the directory and its free space."""


def _free_space(directory: Path) -> str:
    """'12.3 MiB free' (or GiB) on the filesystem of `directory` or its nearest existing parent."""
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return "free space unknown"
    if free >= 1024**3:
        return f"{free / 1024**3:.1f} GiB free"
    return f"{free / 1024**2:.1f} MiB free"


def _fsync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable (a no-op where directories cannot be opened)."""
    try:
        handle = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def atomic_save(obj: Any, path: str | Path, save: Callable[[Any, Any], Any] | None = None) -> Path:
    """`save(obj, file)` (by default torch.save) to `path`, whole or not at all.

    The bytes go to a temporary file beside `path` (so the rename is atomic
    whatever `$TMPDIR` is), are flushed and fsync'd, then the file is renamed
    over `path` and the directory fsync'd. Any failure removes the temporary
    file; an OSError (a full disk, a read-only volume) becomes one
    CheckpointSaveError naming the directory and its free space.
    """
    path = Path(path)
    directory = path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=PARTIAL, dir=directory)
    except OSError as error:
        raise CheckpointSaveError(_save_failure(path, error)) from error
    out = None
    try:
        with os.fdopen(handle, "wb") as file:
            out = _Writes(file)
            (save or torch.save)(obj, cast(IO[bytes], out))  # it only writes
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        Path(temporary).unlink(missing_ok=True)
        if not isinstance(error, OSError):
            # torch.save's zip writer turns a failed write into "RuntimeError: ...
            # unexpected pos"; the write's own error says what happened.
            error = getattr(out, "failure", None) or error
        if isinstance(error, OSError):
            raise CheckpointSaveError(_save_failure(path, error)) from error
        raise
    _fsync_directory(directory)
    return path


class _Writes:
    """A file that remembers the OSError of a failed write (torch.save hides it)."""

    def __init__(self, file: Any) -> None:
        self.file, self.failure = file, None

    def write(self, data: Any) -> int:
        try:
            return self.file.write(data)
        except OSError as error:
            self.failure = error
            raise

    def flush(self) -> None:
        self.file.flush()


class _Unreadable(Exception):
    """The file being copied could not be read."""


def atomic_copy(source: str | Path, path: str | Path) -> bool:
    """Copy the file `source` to `path`, whole or not at all (as `atomic_save` writes).

    A file of its own, not a link: a damaged or overwritten one leaves the
    other intact. False (and nothing changed) when `source` cannot be read;
    a failure to write is a CheckpointSaveError like a save's.
    """

    def copy(reader, out) -> None:
        while True:
            try:
                chunk = reader.read(1 << 20)
            except OSError as error:
                raise _Unreadable from error
            if not chunk:
                return
            out.write(chunk)

    try:
        with open(source, "rb") as reader:
            atomic_save(reader, path, save=copy)
    except (_Unreadable, OSError):  # not the write: atomic_save raises CheckpointSaveError
        return False
    return True


def _save_failure(path: Path, error: OSError) -> str:
    reason = error.strerror or str(error)
    blocking = next((p for p in path.parents if p.exists()), None)
    if blocking is not None and not blocking.is_dir():
        reason = f"{blocking} is a file, not a folder"
    return (
        f"cannot write {path.name} in {path.parent}/: {reason} ({_free_space(path.parent)});"
        " what was there before is intact"
    )


def state_dict_mismatch(error: BaseException) -> str | None:
    """One line for a checkpoint of another model, from torch's multi-line load error."""
    text = str(error)
    if "Error(s) in loading state_dict" not in text:
        return None
    model = re.search(r"state_dict for (\w+)", text)
    parts = []
    for kind in ("Missing", "Unexpected"):
        found = re.search(rf"{kind} key\(s\) in state_dict: (.*?)\.\s*(?:\n|$)", text)
        if found:
            keys = re.findall(r'"([^"]+)"', found.group(1))
            shown = ", ".join(keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")
            parts.append(f"{kind.lower()} keys {shown}")
    shapes = re.findall(r"size mismatch for ([\w.]+)", text)
    if shapes:
        parts.append("different shapes for " + ", ".join(shapes[:4]))
    name = model.group(1) if model else "the model"
    return f"the checkpoint does not fit {name}: " + "; ".join(parts or ["its weights differ"])


def remove_partial_files(directory: Path) -> list[Path]:
    """Delete what writes that were killed half-way left in `directory`."""
    leftovers = sorted(directory.glob(f".*{PARTIAL}")) if directory.is_dir() else []
    for leftover in leftovers:
        leftover.unlink(missing_ok=True)
    return leftovers


def _tensors(tree: Any, path: tuple = ()) -> Iterator[tuple[tuple, torch.Tensor]]:
    """The plain tensors in the dicts, lists and tuples of `tree`, each with where it is."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _tensors(value, (*path, key))
    elif isinstance(tree, list | tuple):
        for index, value in enumerate(tree):
            yield from _tensors(value, (*path, index))
    elif type(tree) in (torch.Tensor, nn.Parameter) and tree.layout == torch.strided:
        yield path, tree  # (a DTensor, a sparse or quantized one: deep-copied whole)


class BackgroundWriter:
    """Writes checkpoints in a thread of its own, one at a time, from a copy in host memory.

    `save` copies the state into host buffers kept from one save to the next (pinned
    for CUDA tensors, so the copies run at the bus's speed and the step waits for
    them once), then hands the write (`atomic_save`'s: file, fsync, rename) to the thread
    and returns. A save asked for while the previous one is still being written
    waits for it first: at most one is in flight, and the buffers are reused only
    once written. A failed write is raised by the next `check` (each step),
    `wait` or `save`. The seconds a step spent copying and waiting are counted.
    """

    clock: Callable[[], float] = staticmethod(time.perf_counter)

    def __init__(self) -> None:
        self._thread: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._shard_stager: Any = None  # torch's DefaultStager, made for FSDP's first save
        self._staged: tuple[Path, Any] | None = None  # the last save's path and copy
        self.saves, self.copy_seconds, self.wait_seconds = 0, 0.0, 0.0

    def stage(self, state: Any) -> Any:
        """A copy of `state` that nothing the training does later changes: its tensors
        copied into host buffers kept from the previous save (pinned for CUDA tensors,
        the copies queued, then waited for once), the rest (counters, random states,
        sample orders) deep-copied. (torch's DefaultStager does this too, but through a
        decorated call for every Python object: 1.2 ms here, 40 ms there, for the
        example's checkpoint of 1,500 objects.)"""
        buffers, memo, on_cuda = {}, {}, False
        for path, tensor in _tensors(state):
            buffer = self._buffers.get(path)
            if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
                buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=tensor.is_cuda)
            buffer.copy_(tensor.detach(), non_blocking=tensor.is_cuda)
            on_cuda = on_cuda or tensor.is_cuda
            buffers[path] = memo[id(tensor)] = buffer
        if on_cuda:
            torch.cuda.synchronize()  # copied before the step changes the weights again
        self._buffers = buffers  # a buffer whose tensor a later state lacks is let go
        return copy.deepcopy(state, memo)

    @property
    def shard_stager(self) -> Any:
        """torch's staging for its distributed checkpoint's asynchronous save (FSDP's
        shards), kept from one save to the next with the host memory it holds."""
        if self._shard_stager is None:
            # (Imported here: torch.distributed.checkpoint takes 0.7 s to import.)
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            cuda = torch.cuda.is_available()
            self._shard_stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=cuda,
                    use_shared_memory=False,
                    use_async_staging=False,  # copied before the step goes on
                    use_non_blocking_copy=cuda,  # one wait for all the copies
                )
            )
        return self._shard_stager

    def save(self, state: Any, path: str | Path) -> None:
        """Copy `state` and write it to `path` in the background (`atomic_save`)."""
        self.wait()
        try:
            staged = self.timed(partial(self.stage, state))
        except (TypeError, copy.Error) as error:  # an object that cannot be copied
            rank_zero_warn(
                f"checkpoint {Path(path).name} holds something that cannot be copied ({error}):"
                " written in the step instead"
            )
            atomic_save(state, path)
            return
        self._staged = (Path(path), staged)
        self.run(partial(atomic_save, staged, path))

    def timed(self, copying: Callable[[], Any]) -> Any:
        """`copying()`, its seconds counted as the steps' time spent copying."""
        start = self.clock()
        try:
            return copying()
        finally:
            self.copy_seconds += self.clock() - start

    def save_again(self, source: str | Path, path: str | Path) -> bool:
        """Write the state the last save wrote to `source` to `path` too, after it, as part
        of the same save (the step does not wait); False if that save was not `source`'s."""
        if self._staged is None or self._staged[0] != Path(source):
            return False
        before, staged = self._pending, self._staged[1]

        def after() -> None:
            if before is not None:
                before.result()  # a failed first write fails this one: its error is raised
            atomic_save(staged, path)

        self._pending = self._start(after)
        return True

    def run(self, job: Callable[[], Any]) -> None:
        """`job` in the background, once the save in flight is written."""
        self.wait()
        self._pending = self._start(job)
        self.saves += 1

    def _start(self, job: Callable[[], Any]) -> Future:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-writer")
        return self._thread.submit(job)

    def wait(self) -> None:
        """Until the save in flight is written; raises its failure."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        start = self.clock()
        try:
            pending.result()
        finally:
            self.wait_seconds += self.clock() - start

    def check(self) -> None:
        """Raise the failure of a save whose write has ended; never waits."""
        if self._pending is not None and self._pending.done():
            self.wait()

    def close(self) -> None:
        """Wait for the save in flight, end the thread and let the buffers go."""
        try:
            self.wait()
        finally:
            self._staged, self._buffers = None, {}
            if self._shard_stager is not None:
                self._shard_stager.close()
                self._shard_stager = None
            if self._thread is not None:
                self._thread.shutdown()
                self._thread = None


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint IO, writing local files with `atomic_save`, in the
    background (`BackgroundWriter`) unless `background` is False.

    (Lightning writes through an fsspec transaction whose temporary file lives
    in `$TMPDIR`: a copy, not an atomic rename, when that is another filesystem,
    and nothing is fsync'd. Its AsyncCheckpointIO copies the state on the device,
    queues any number of saves and raises a failed one only at the next save.)
    Remote paths (`s3://...`) keep Lightning's own way, written in the step.
    """

    def __init__(self, background: bool = True) -> None:
        super().__init__()
        self.writer = BackgroundWriter() if background else None

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        if storage_options is not None or "://" in str(path):
            if self.writer is not None:
                self.writer.wait()  # one save at a time, in order
            return super().save_checkpoint(checkpoint, path, storage_options)
        if self.writer is None:
            atomic_save(checkpoint, path)
        else:
            self.writer.save(checkpoint, path)

    def copy(self, source: str | Path, path: str | Path) -> bool:
        """`path` gets what the file `source`, saved this step, holds; False if it cannot
        be read (the caller saves instead)."""
        if self.writer is not None:
            if self.writer.save_again(source, path):
                return True
            self.writer.wait()
        return atomic_copy(source, path)

    def teardown(self) -> None:
        if self.writer is not None:
            self.writer.close()


def background_writer(trainer: Trainer) -> BackgroundWriter | None:
    """The trainer's BackgroundWriter, if its checkpoints are written by one."""
    return getattr(trainer.strategy.checkpoint_io, "writer", None)


def check_checkpoint(path: str | Path) -> Path:
    """`path` as a Path if it is a complete checkpoint file, else CheckpointError.

    torch.save writes a zip archive whose index is at the very end: a file cut
    short (a copy or a save that was killed) has none, and a damaged byte fails
    its member's CRC.
    """
    file = Path(path)
    if is_sharded(file, committed_or_not=True):  # a folder of shards (configs/fsdp.yaml)
        problem = check_sharded(file)
        if problem:
            raise CheckpointError(
                f"checkpoint folder '{file}' is not usable: {problem}; use another checkpoint"
            )
        return file
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


def foreign_model(checkpoint: Path, model: type) -> str | None:
    """Why `checkpoint` holds another kind of model than `model` (hyperparameters that are
    not its arguments, which Lightning would rebuild the model from), or None. A folder
    of shards keeps them in its meta file: not looked at."""
    if checkpoint.is_dir():
        return None
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
    given = saved.get("hyper_parameters") or {}
    hparams = {key for key in given if not key.startswith("_")}  # (Lightning's own: _...)
    if not hparams or "_class_path" in given:
        return None
    takes = {name.partition(".")[0] for name in init_parameters(model)}
    strangers = sorted(hparams - takes)
    if not strangers:
        return None
    return (
        f"checkpoint '{checkpoint}' holds another model: its hyperparameters"
        f" {', '.join(strangers[:4])} are not arguments of {model.__name__} (which takes"
        f" {', '.join(sorted(takes)[:6]) or 'none'}); use a checkpoint of this project's model"
    )


def resume_candidates(runs: Iterable[Path], root: Path | None = None) -> list[Path]:
    """What `--ckpt_path last` may resume from, newest first: each run's `last.ckpt`,
    `interrupted.ckpt` and `best-*.ckpt`, and `hpc_ckpt_N.ckpt` in `root` (what
    Lightning saves when SLURM preempts a job)."""
    files = []
    for run in runs:
        folder = run / "checkpoints"
        files += [folder / name for name in RESUMABLE] + list(folder.glob("best-*.ckpt"))
    if root is not None:
        files += root.glob("hpc_ckpt_*.ckpt")
    files = [file for file in files if file.exists()]
    return sorted(files, key=_written_at, reverse=True)


def _written_at(path: Path) -> float:
    """When a checkpoint was written: a file's mtime, a sharded folder's marker's."""
    marker = path / COMMITTED
    return (marker if path.is_dir() and marker.is_file() else path).stat().st_mtime


def resolve_last(config: dict[str, Any], newest_run: bool = False) -> Path | None:
    """Turn `ckpt_path: last` in a subcommand's config into the newest intact checkpoint
    (with `newest_run`, only the newest run's: the one a restarted job started).

    Each damaged candidate is named and skipped. Also points the logger at the
    checkpoint's run, so logs, config and new checkpoints continue in the same
    directory. Returns the checkpoint, or None: nothing usable to resume, and the
    run starts afresh (`ckpt_path` becomes null).
    """
    logger = config.get("trainer", {}).get("logger")
    if config.get("ckpt_path") != "last":
        return None
    root = Path(config["trainer"].get("default_root_dir") or ".")
    runs = run_candidates(logger)
    if newest_run:
        runs, root = sorted(runs, key=_written_at)[-1:], None
    if is_first_process():
        for run in runs:  # a kill between a sharded save's two renames
            for done in recover_folders(run / "checkpoints"):
                rank_zero_info(f"{run / 'checkpoints'}: {done}")
    candidates = resume_candidates(runs, root)
    for candidate in candidates:
        try:
            check_checkpoint(candidate)
        except CheckpointError as error:
            rank_zero_info(f"Skipping {candidate}: {error}")
            continue
        config["ckpt_path"] = str(candidate)
        if candidate.parent.name == "checkpoints":  # not an hpc checkpoint: continue its run
            continue_run(logger, candidate.parent.parent)
            if is_first_process():
                for leftover in remove_partial_files(candidate.parent):
                    rank_zero_info(f"Removed {leftover.name}, left by a write that was cut off")
        rank_zero_info(
            f"Resuming from {candidate} (the newest intact of {', '.join(RESUMABLE)},"
            " best-*.ckpt, hpc_ckpt_*)"
        )
        return candidate
    damaged = f" ({len(candidates)} damaged, named above)" if candidates else ""
    rank_zero_info(f"No checkpoint to resume{damaged}: starting a new run")
    config["ckpt_path"] = None
    return None


ASYNC = "async"  # BestAndLast's keyword argument: write checkpoints in the background


class BestAndLast(ModelCheckpoint):
    """ModelCheckpoint whose `last.ckpt` is rewritten at every epoch's end.

    Lightning 2.6 rewrites `last.ckpt` only when a top-k checkpoint is saved
    too, so after an epoch that did not improve, `last` is an epoch behind
    and a resume would redo it. Here `last` is always the latest state.

    When an epoch improved, the best checkpoint just written holds the same
    state as `last` would (from the second save of `last` on): `last.ckpt` is
    then a copy of its bytes (written as atomically as a save) instead of a
    second collection and serialization of the same state.

    `every_n_train_steps` and `train_time_interval` save `last.ckpt` mid-epoch,
    after an optimizer step, and nothing else: the best is still chosen after
    each validation. (Lightning would save a `best-*` file at those steps with
    the previous validation's score, defer every save of the first epoch until
    its validation, and stop saving at epochs' ends.)

    `async` (`--checkpoint.async`; a keyword in Python, hence read from the
    keyword arguments): true (the default) writes each checkpoint in the background
    from a copy in host memory, false writes it in the step.
    """

    _last_before: str | None = None  # last_model_path while `last` is being saved
    best_epoch: int | None = None  # the epoch the best checkpoint was saved in
    _last_time = 0.0  # when the time trigger last fired
    clock: Callable[[], float] = staticmethod(time.monotonic)

    def __init__(
        self,
        *args: Any,
        every_n_train_steps: int | None = None,
        train_time_interval: timedelta | None = None,
        **kwargs: Any,
    ) -> None:
        # ModelCheckpoint's arguments; its step and time triggers are kept here, and
        # Lightning's saves at epochs' ends go on beside them.
        # `async`, a keyword in Python, read through a name: jsonargparse's reading of the
        # source finds no such key, and the CLI adds `--checkpoint.async` typed (a bool).
        self.background = kwargs.pop(ASYNC, True)
        self._mid_epoch = (every_n_train_steps or 0, train_time_interval)
        if every_n_train_steps or train_time_interval is not None:
            kwargs["every_n_epochs"] = kwargs.get("every_n_epochs") or 1
        super().__init__(*args, **kwargs)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._last_time = self.clock()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Lightning saves `last` here even in a fast_dev_run, which saves nothing else.
        if not trainer.fast_dev_run:
            super().on_train_end(trainer, pl_module)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, index: int
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, index)
        writer = background_writer(trainer)
        if writer is not None:
            writer.check()  # a background write that failed stops the run here
        steps, interval = self._mid_epoch
        if accumulating(trainer) or (not steps and interval is None):
            return
        due = bool(steps) and trainer.global_step % steps == 0
        if interval is not None:
            now = self.clock()
            # Rank 0's clock decides, so that every rank saves together.
            if trainer.strategy.broadcast(now - self._last_time >= interval.total_seconds()):
                due, self._last_time = True, now
        if due and self.save_last and not skips_saving(self, trainer):
            before = last_saved(self)[1]
            self._save_last_checkpoint(trainer, monitor_candidates(self, trainer))
            forget_step_saved(self, before)  # an epoch's own saves at this step still happen

    @property
    def state_key(self) -> str:
        # Lightning builds this name for every hook it calls, about six a step;
        # ModelCheckpoint's is a repr of its settings, which do not change.
        if "_state_key" not in self.__dict__:
            self._state_key = super().state_key
        return self._state_key

    def _save_last_checkpoint(self, trainer: Trainer, monitor_candidates: dict) -> None:
        self._last_before = self.last_model_path
        try:
            super()._save_last_checkpoint(trainer, monitor_candidates)
        finally:
            self._last_before = None

    def _save_checkpoint(self, trainer: Trainer, filepath: str) -> None:
        if filepath == self.best_model_path:
            self.best_epoch = trainer.current_epoch
        source, step = last_saved(self)
        same_step = step == trainer.global_step
        # The best file records `last_model_path` as it was before this save:
        # the same state only if `last` keeps its path (not on the first save).
        same_path = self._last_before == filepath
        # Only a file our own checkpoint IO wrote is surely whole (or being written).
        io = trainer.strategy.checkpoint_io
        sharded = isinstance(trainer.strategy, ModelParallelStrategy)  # folders, saved again
        ours = isinstance(io, AtomicCheckpointIO) and not sharded
        if same_step and same_path and ours and source and source != filepath:
            copied = io.copy(source, filepath) if trainer.is_global_zero else True
            if trainer.strategy.broadcast(copied):
                trainer.strategy.barrier("BestAndLast.copy")
                note_saved(self, filepath)
                if trainer.is_global_zero:
                    for logger in trainer.loggers:
                        logger.after_save_checkpoint(proxy(self))
                return
        super()._save_checkpoint(trainer, filepath)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "best_epoch": self.best_epoch}

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._fitting = stage == "fit"  # set before a checkpoint's state is restored

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not getattr(self, "_fitting", True):
            return  # validate, test and predict save nothing: the run's saves are not theirs
        self.best_epoch = state_dict.get("best_epoch")
        # A run continued from another path (the project moved, another mount,
        # a relative save_dir become absolute) is still the same run: Lightning
        # would forget its best and last checkpoints and write `last-v1.ckpt`.
        stored, current = state_dict.get("dirpath"), self.dirpath
        if stored and current and stored != current:
            if Path(stored).parts[-3:] == Path(current).parts[-3:]:
                state_dict = _moved(state_dict, str(stored), str(current))
        super().load_state_dict(state_dict)

    def _save_last_regardless(self, trainer: Trainer) -> None:
        if self.save_last and not skips_saving(self, trainer):
            self._save_last_checkpoint(trainer, monitor_candidates(self, trainer))

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if saves_at_train_epoch_end(self, trainer):
            self._save_last_regardless(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not saves_at_train_epoch_end(self, trainer):
            self._save_last_regardless(trainer)


def _moved(state_dict: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    """ModelCheckpoint's state with the paths under `old` moved under `new`."""

    def move(path: Any) -> Any:
        if isinstance(path, str) and path.startswith(old):
            return new + path[len(old) :]
        return path

    moved = {key: move(value) for key, value in state_dict.items()}
    moved["best_k_models"] = {
        move(path): score for path, score in state_dict.get("best_k_models", {}).items()
    }
    return moved


class InterruptCheckpoint(OnExceptionCheckpoint):
    """Lightning's OnExceptionCheckpoint as `interrupted.ckpt` beside the other
    checkpoints, written when the run is stopped; removed when a fit ends normally.

    Kept narrower than Lightning's, which saves on any exception into a folder
    fixed when it is built: only SIGTERM (what SLURM, Kubernetes and other
    schedulers send before they kill a job), SLURM's requeue signal and Ctrl-C,
    which every rank receives, so all ranks save together (after a crash on one
    rank, a collective save would wait for the others forever); into the run's
    own checkpoint folder, known only once the run started; and only once a
    step was taken, so that there is something to resume.

    Under SLURM, the signal `--signal=SIGUSR1@90` sends before the time limit
    stops the run the same way, and then rank 0 asks for the job to be requeued
    (`scontrol requeue`), once. It takes the place of Lightning's own handler,
    which saves and requeues inside the signal handler, at whatever point of a
    step each rank is: a collective there waits for ranks that are elsewhere.
    """

    FILENAME = "interrupted.ckpt"

    def __init__(self) -> None:
        super().__init__(dirpath=".", filename=Path(self.FILENAME).stem)
        self._ctrl_c = self._sigterm = self._sigterm_held = False
        self._handler: Any = None
        self._requeue: str | None = None  # the SLURM job to requeue once stopped
        self._requeue_handler: tuple[int, Any] | None = None

    @property
    def stop_pending(self) -> bool:
        """Whether SIGTERM or a first Ctrl-C asked this fit to stop, and it has not yet."""
        return self._ctrl_c or self._sigterm

    # A stop lands between two steps: then the checkpoint holds one consistent state
    # (weights, optimizer, random states, data position) that a resume continues
    # exactly. Lightning alone stops on SIGTERM after the step in progress (not
    # on one that arrives between steps, in an epoch's start), and on Ctrl-C
    # wherever the KeyboardInterrupt lands.
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._ctrl_c = self._sigterm = False
        self._requeue = None
        on_main_thread = threading.current_thread() is threading.main_thread()
        if on_main_thread and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._handler = signal.signal(signal.SIGINT, self._on_ctrl_c)
        if on_main_thread and SLURMEnvironment.detect():
            # Before Lightning registers its own: it then leaves the signal to this one.
            environment = getattr(trainer.strategy, "cluster_environment", None)
            sent = getattr(environment, "requeue_signal", None) or signal.SIGUSR1
            previous = signal.signal(sent, self._on_requeue_signal)
            self._requeue_handler = (sent, previous)
        if trainer.world_size > 1:
            on_sigterm_in_fit(trainer, partial(self._on_sigterm, trainer))
            before_each_step_stop_check(trainer, partial(self._stop_together, trainer))

    # Several processes stop at one step's start, all together. Lightning's own
    # SIGTERM handler broadcasts from inside the handler: a collective at whatever
    # point of a step the signal finds each rank, which pairs with another
    # collective (FSDP makes many a step) when the ranks are at different points,
    # and the run hangs. Here a signal is only noted; rank 0's note becomes
    # Lightning's stop flag just before its broadcast at the next step's start.
    def _on_sigterm(self, trainer: Trainer, signum: int, frame: Any) -> None:
        if not self._sigterm and trainer.strategy.launcher is not None:
            trainer.strategy.launcher.kill(signum)  # the ranks it started, as Lightning does
        self._sigterm = True

    def _on_requeue_signal(self, signum: int, frame: Any) -> None:
        self._requeue = slurm_job()
        self._sigterm = True

    def _stop_together(self, trainer: Trainer) -> None:
        if self.stop_pending and trainer.global_rank == 0:
            request_stop(trainer)

    def _on_ctrl_c(self, signum: int, frame: Any) -> None:
        if self._ctrl_c:  # the second: stop now
            self._restore_handler()
            raise KeyboardInterrupt
        self._ctrl_c = True
        print("\nCtrl-C: stopping after this step (press again to stop now)", file=sys.stderr)

    def _restore_handler(self) -> None:
        if self._handler is not None:
            signal.signal(signal.SIGINT, self._handler)
            self._handler = None
        if self._requeue_handler is not None:
            signal.signal(*self._requeue_handler)
            self._requeue_handler = None

    # Lightning stops a validation half-way on SIGTERM, and the resume then skips
    # the rest of it: the epoch's score, best and last would be lost. The stop
    # waits for the validation's end instead, and comes at the epoch's end.
    def on_validation_batch_end(self, trainer: Trainer, *args: Any) -> None:
        fitting = trainer.state.fn == "fit" and not trainer.sanity_checking
        if fitting and trainer.received_sigterm:
            self._sigterm_held = True
            request_stop(trainer, False)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._sigterm_held:
            self._sigterm_held = False
            # After the run's last validation there is nothing left to stop: it ends as it would.
            request_stop(trainer, not training_done(trainer, after_validation=True))

    def on_train_batch_start(self, trainer: Trainer, pl_module, batch: Any, batch_idx: int) -> None:
        if trainer.world_size > 1:
            return  # Lightning checks for SIGTERM before every step of a multi-process run
        if self._ctrl_c:
            raise KeyboardInterrupt
        if trainer.received_sigterm or self._sigterm:
            raise SIGTERMException

    def _run_folder(self, trainer: Trainer) -> str | None:
        return getattr(trainer.checkpoint_callback, "dirpath", None)

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        self._restore_handler()
        folder = self._run_folder(trainer)
        if folder is None or not isinstance(exception, (SIGTERMException, KeyboardInterrupt)):
            return
        if isinstance(exception, SIGTERMException) and training_done(trainer):
            keep_context(exception, {"finished": True})  # the stop came after the last step
            return
        if trainer.global_step > 0:  # a step taken: something to resume
            self.dirpath = folder
            # Lightning's own call, saying what it saves (it warns when weights_only is
            # unset): the full training state, to resume from.
            trainer.save_checkpoint(self.ckpt_path, weights_only=False)
            writer = background_writer(trainer)
            if writer is not None:
                writer.wait()  # on disk before the process ends and says so
            rank_zero_info(f"Stopped: saved {self.ckpt_path}; continue with `fit --ckpt_path last`")
        if self._requeue is not None:
            keep_context(exception, {"stopped_by": "SLURM's requeue signal"})
            if trainer.is_global_zero:  # once, after the checkpoint is whole on disk
                rank_zero_info(requeue(self._requeue))

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._restore_handler()
        # Called when a fit ended normally (not after an exception): nothing to resume.
        folder = self._run_folder(trainer)
        if stage == "fit" and folder is not None:
            self.dirpath = folder
            super().teardown(trainer, pl_module, stage)


def training_done(trainer: Trainer, after_validation: bool = False) -> bool:
    """Whether the fit has trained all it was to (max_steps, or max_epochs completed; with
    `after_validation`, once this epoch's validation, its last step taken, is over)."""
    if trainer.max_steps not in (None, -1) and trainer.global_step >= trainer.max_steps:
        return True
    if trainer.max_epochs in (None, -1):
        return False
    progress = trainer.fit_loop.epoch_progress.current
    if after_validation:
        last_batch = trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        return bool(last_batch) and trainer.current_epoch + 1 >= trainer.max_epochs
    return progress.completed >= trainer.max_epochs


def slurm_job() -> str:
    """This SLURM job's id as `scontrol` names it (an array task: `<job>_<task>`)."""
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array is not None:
        return f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ["SLURM_JOB_ID"]


def requeue(job: str) -> str:
    """Put SLURM job `job` back in the queue (`scontrol requeue`); one line on what happened."""
    try:
        done = subprocess.run(
            ["scontrol", "requeue", job], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"could not requeue SLURM job {job} ({error}): resubmit it; it continues"
    if done.returncode != 0:
        why = done.stderr.strip() or f"exit code {done.returncode}"
        return f"scontrol requeue {job} failed ({why}): resubmit the job; it continues"
    return f"Requeued SLURM job {job}: it continues from its newest checkpoint"


class ResumeCheck(Callback):
    """Says so when a resumed run had nothing left to do, and how to continue it."""

    def __init__(self) -> None:
        self._start_step: int | None = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start_step = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start_step = trainer.global_step  # restored by now; not called with nothing to do

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        stepped = self._start_step is not None and trainer.global_step > self._start_step
        if not trainer.ckpt_path or stepped:
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


# Sharded checkpoint folders (kit/sharding.py writes them) ----------------------


def is_sharded(path: str | Path, committed_or_not: bool = False) -> bool:
    """Whether `path` is a sharded (distributed) checkpoint folder; with
    `committed_or_not`, also one whose write did not finish."""
    folder = Path(path)
    if not folder.is_dir():
        return False
    if (folder / DCP_METADATA).is_file():
        return True
    marks = (COMMITTED, ".metadata")
    return committed_or_not and (
        any((folder / m).exists() for m in marks) or any(folder.glob("*.distcp"))
    )


def check_sharded(path: Path) -> str | None:
    """None when `path` is a complete sharded checkpoint folder, else why not."""
    if not (path / COMMITTED).is_file():
        return "its write did not finish (no COMMITTED marker)"
    if not (path / DCP_METADATA).is_file():
        return f"it has no {DCP_METADATA}"
    if not (path / ".metadata").is_file():
        return "it has no .metadata of torch.distributed.checkpoint"
    return None


def recover_folders(directory: Path) -> list[str]:
    """Finish or undo the swaps a kill interrupted in `directory`: a `<name>.old` whose
    `<name>` is gone is renamed back; `.partial` folders and stale `.old` ones are removed."""
    done = []
    if not directory.is_dir():
        return done
    for old in directory.glob(f"*{OLD_FOLDER}"):
        target = old.with_name(old.name[: -len(OLD_FOLDER)])
        if old.is_dir() and not target.exists():
            os.replace(old, target)
            done.append(f"restored {target.name} from {old.name}")
        elif old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    for partial_folder in directory.glob(f"*{PARTIAL_FOLDER}"):
        if partial_folder.is_dir():
            shutil.rmtree(partial_folder, ignore_errors=True)
            done.append(f"removed {partial_folder.name}")
    return done


def commit_folder(partial_folder: Path, path: Path) -> None:
    """Mark `partial_folder` complete, then put it where `path` is, replacing what was there
    (through `<path>.old`, so a kill at any moment leaves one complete folder to resume)."""
    marker = partial_folder / COMMITTED
    with open(marker, "w") as file:
        file.write("complete\n")
        file.flush()
        os.fsync(file.fileno())
    _fsync_directory(partial_folder)
    old = path.with_name(path.name + OLD_FOLDER)
    if path.is_dir():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
    elif path.exists():
        path.unlink()
    os.replace(partial_folder, path)
    _fsync_directory(path.parent)
    shutil.rmtree(old, ignore_errors=True)
