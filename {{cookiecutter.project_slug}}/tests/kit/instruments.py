"""A callback the fault and DDP tests attach to real runs of the CLI.

    run_cli("fit", "--trainer.callbacks+=instruments.Instruments", env={...})

(`run_cli` puts this folder on PYTHONPATH.) It is set by environment
variables, which DDP's and torchrun's worker processes inherit. A step here is a
training batch (`total_batch_idx`, counted across epochs): a model that steps several
optimizers by hand takes more optimizer steps (`global_step`) than batches.

- INSTRUMENTS_RECORD=<prefix>: when training starts (after any resume), at
  each epoch's start and when training ends, append one JSON line to
  `<prefix>-rank<R>.jsonl`: the event, torchrun's attempt, rank, world size,
  epoch, global step, the sample indices this rank's sampler yields this epoch
  (none for a stream), fingerprints of the parameters and of the optimizer
  state, and the schedulers' states;
- INSTRUMENTS_SAMPLES=<prefix>: at each training batch, append one JSON line to
  `<prefix>-rank<R>.jsonl` (event "batch"): the rank, the optimizer step it goes
  into (`global_step`), the epoch and a fingerprint of each sample of the batch (its first
  tensor's row, hashed): which samples each step trained, on every rank;
- INSTRUMENTS_NO_DROPOUT=1: dropout layers off (p = 0) from the fit's start, for a
  model whose runs on other numbers of processes can then match;
- INSTRUMENTS_PAUSE_EPOCH=<n> and INSTRUMENTS_PAUSE_MARKER=<file>: at the start
  of epoch n, rank 0 writes the marker and waits there (for a signal); with
  INSTRUMENTS_PAUSE_FIT=<k>, only in the k-th fit (from 0) this process runs
  (a sweep runs one per trial);
- INSTRUMENTS_PAUSE_STEP=<s> (with INSTRUMENTS_PAUSE_MARKER): the same, when step s
  starts (mid-epoch), until a stop signal arrives;
- INSTRUMENTS_PAUSE_VALIDATION=<n> (with INSTRUMENTS_PAUSE_MARKER): the same, when
  epoch n's validation starts;
- INSTRUMENTS_FAIL_RANK=<r> and INSTRUMENTS_FAIL_STEP=<s>: rank r raises at step s
  (INSTRUMENTS_FAIL_STEP=setup: in the fit's setup, before the ranks' second barrier);
- INSTRUMENTS_SLEEP_RANK=<r> and INSTRUMENTS_SLEEP_STEP=<s>: rank r sleeps (for up to
  ten minutes) in step s, taking no more part in the job;
- INSTRUMENTS_NAN_STEP=<s>: from step s on, the first parameter is NaN before each step
  (the loss of every rank then is too);
- INSTRUMENTS_KILL_STEP=<s>: the process SIGKILLs itself when step s starts (with
  INSTRUMENTS_KILL_GROUP=1, rank 0 SIGKILLs its whole process group: every rank;
  INSTRUMENTS_KILL_SIGNAL=SIGTERM: SIGTERM instead; with INSTRUMENTS_KILL_SETTLED=1,
  once the checkpoint being written is on disk; with INSTRUMENTS_KILL_STAGGER=1,
  each rank r sends the signal to itself alone, when step s - r starts: a signal
  that reaches the ranks at different points of a step; with INSTRUMENTS_KILL_RANK=<r>,
  rank r alone; with INSTRUMENTS_KILL_ATTEMPT=<k>, only in torchrun's k-th start of the
  workers, from 0);
- INSTRUMENTS_KILL_SAVE=<k>: the process SIGKILLs itself half-way through writing
  the k-th checkpoint it saves (1 = the first);
- INSTRUMENTS_SLOW_LOADER_RANK=<r>, _SECONDS=<s>: rank r's loader yields each train batch s late;
- INSTRUMENTS_FILL=<file> and INSTRUMENTS_FILL_EPOCH=<n>: at the start of epoch n,
  fill the disk of <file> with it, leaving room for half the last checkpoint.
"""

import hashlib
import io
import json
import os
import signal
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback
from torch.utils.data import IterableDataset

from {{ cookiecutter.package_name }}.kit.checkpoints import background_writer


def parameter_fingerprint(state_dict: dict) -> float:
    """The sum of every floating-point tensor of a module's state_dict."""
    return float(
        sum(value.double().sum() for value in state_dict.values() if value.is_floating_point())
    )


def optimizer_fingerprint(optimizer_state: dict) -> float:
    """The sum of every tensor in an optimizer's state_dict()['state'] (0.0 when fresh)."""
    return float(
        sum(
            value.double().sum()
            for per_param in optimizer_state["state"].values()
            for value in per_param.values()
            if torch.is_tensor(value)
        )
    )


FITS_STARTED = [0]  # fits this process has started (a sweep runs several)


class Instruments(Callback):
    def __init__(self) -> None:
        self.fit_index = None

    def on_fit_start(self, trainer, pl_module) -> None:
        self.fit_index = FITS_STARTED[0]
        FITS_STARTED[0] += 1
        if os.environ.get("INSTRUMENTS_NO_DROPOUT"):
            for module in pl_module.modules():
                if isinstance(module, torch.nn.modules.dropout._DropoutNd):
                    module.p = 0.0
        saves = os.environ.get("INSTRUMENTS_KILL_SAVE")
        if saves:
            kill_during_save(int(saves))
        slow = os.environ.get("INSTRUMENTS_SLOW_LOADER_RANK")
        if slow and trainer.global_rank == int(slow):  # before the fit asks for its loader
            slow_train_loader(trainer, float(os.environ["INSTRUMENTS_SLOW_LOADER_SECONDS"]))

    def setup(self, trainer, pl_module, stage: str) -> None:
        rank = os.environ.get("INSTRUMENTS_FAIL_RANK")
        if os.environ.get("INSTRUMENTS_FAIL_STEP") == "setup" and trainer.global_rank == int(rank):
            raise RuntimeError(f"injected fault on rank {rank} in setup")

    def _record(self, trainer, pl_module, event: str) -> None:
        prefix = os.environ.get("INSTRUMENTS_RECORD")
        if not prefix:
            return
        loader = trainer.train_dataloader
        sampler = getattr(loader, "sampler", None)
        record = {
            "event": event,
            "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),  # torchrun's
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "epoch": trainer.current_epoch,
            "global_step": trainer.global_step,
            "batches": trainer.fit_loop.epoch_loop.batch_progress.total.processed,
            "sampler": type(sampler).__name__,
            "step_samples": getattr(sampler, "step_samples", None),
            "indices": indices_of(loader),
            "parameters": parameter_fingerprint(pl_module.state_dict()),
            "optimizers": [optimizer_fingerprint(o.state_dict()) for o in trainer.optimizers],
            "schedulers": [c.scheduler.state_dict() for c in trainer.lr_scheduler_configs],
        }
        with open(f"{prefix}-rank{trainer.global_rank}.jsonl", "a") as file:
            file.write(json.dumps(record, default=repr) + "\n")

    def on_train_start(self, trainer, pl_module) -> None:
        # After a resume: what was restored, before any step of this run.
        self._record(trainer, pl_module, "train_start")

    def on_train_end(self, trainer, pl_module) -> None:
        self._record(trainer, pl_module, "train_end")

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._record(trainer, pl_module, "epoch_start")
        fill = os.environ.get("INSTRUMENTS_FILL")
        if fill and trainer.current_epoch == int(os.environ["INSTRUMENTS_FILL_EPOCH"]):
            last = trainer.checkpoint_callback.last_model_path
            on_disk(trainer)
            fill_disk(Path(fill), leave=os.path.getsize(last) // 2 if last else 0)
        pause = os.environ.get("INSTRUMENTS_PAUSE_EPOCH")
        fit = os.environ.get("INSTRUMENTS_PAUSE_FIT")
        if fit is not None and self.fit_index != int(fit):
            pause = None
        if pause and trainer.current_epoch == int(pause) and trainer.global_rank == 0:
            pause_until_stopped(trainer)

    def on_validation_start(self, trainer, pl_module) -> None:
        pause = os.environ.get("INSTRUMENTS_PAUSE_VALIDATION")
        if pause and not trainer.sanity_checking and trainer.current_epoch == int(pause):
            if trainer.global_rank == 0:
                pause_until_stopped(trainer)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        step = trainer.fit_loop.epoch_loop.total_batch_idx  # this batch, from 0
        samples = os.environ.get("INSTRUMENTS_SAMPLES")
        if samples:
            record_samples(f"{samples}-rank{trainer.global_rank}.jsonl", trainer, batch)
        pause = os.environ.get("INSTRUMENTS_PAUSE_STEP")
        if pause and step == int(pause) and trainer.global_rank == 0:
            pause_until_stopped(trainer)
        kill = os.environ.get("INSTRUMENTS_KILL_STEP")
        staggered = bool(os.environ.get("INSTRUMENTS_KILL_STAGGER"))
        rank, attempt = (os.environ.get(f"INSTRUMENTS_KILL_{k}") for k in ("RANK", "ATTEMPT"))
        if rank and trainer.global_rank != int(rank):
            kill = None
        if attempt and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != attempt:
            kill = None
        if kill and step == int(kill) - staggered * trainer.global_rank:
            if os.environ.get("INSTRUMENTS_KILL_SETTLED"):
                on_disk(trainer)  # the checkpoint being written, written
            sent = getattr(signal, os.environ.get("INSTRUMENTS_KILL_SIGNAL", "SIGKILL"))
            group = os.environ.get("INSTRUMENTS_KILL_GROUP") and not staggered
            if group and trainer.global_rank == 0:
                os.killpg(os.getpgid(0), sent)  # every rank, as a scheduler would
            if sent == signal.SIGKILL or staggered:
                os.kill(os.getpid(), sent)
        rank = os.environ.get("INSTRUMENTS_FAIL_RANK")
        fail = os.environ.get("INSTRUMENTS_FAIL_STEP")
        if rank and trainer.global_rank == int(rank) and str(step) == fail:
            raise RuntimeError(f"injected fault on rank {rank} at step {fail}")
        rank = os.environ.get("INSTRUMENTS_SLEEP_RANK")
        if rank and trainer.global_rank == int(rank):
            if step == int(os.environ["INSTRUMENTS_SLEEP_STEP"]):
                time.sleep(600)
        nan = os.environ.get("INSTRUMENTS_NAN_STEP")
        if nan and step >= int(nan):
            with torch.no_grad():
                next(pl_module.parameters()).fill_(float("nan"))


def indices_of(loader) -> list[int] | None:
    """The sample indices this rank's training loader yields this epoch, whether its sampler
    gives them one by one or a batch at a time; None for a stream (an IterableDataset),
    which has none."""
    if loader is None or isinstance(getattr(loader, "dataset", None), IterableDataset):
        return None
    items = list(loader.sampler)
    return [int(i) for item in items for i in (item if isinstance(item, list | tuple) else [item])]


def first_tensor(batch):
    """The first tensor of a batch (a tensor, or a tuple, list or dict holding some)."""
    if torch.is_tensor(batch):
        return batch
    values = batch.values() if isinstance(batch, dict) else batch
    values = values if isinstance(batch, (dict, list, tuple)) else ()
    return next((t for t in map(first_tensor, values) if t is not None), None)


def record_samples(path: str, trainer, batch) -> None:
    rows = first_tensor(batch).detach().cpu()
    prints = [
        hashlib.md5(row.numpy().tobytes()).hexdigest()[:16] for row in rows.reshape(len(rows), -1)
    ]
    record = {"event": "batch", "rank": trainer.global_rank, "step": trainer.global_step}
    record["epoch"] = trainer.current_epoch
    with open(path, "a") as file:
        file.write(json.dumps({**record, "samples": prints}) + "\n")


def stop_requested(trainer) -> bool:
    """Whether SIGTERM or a first Ctrl-C asked the fit to stop."""
    parts = [p for c in trainer.callbacks for p in getattr(c, "parts", [c])]
    return trainer.received_sigterm or any(getattr(p, "stop_pending", False) for p in parts)


def on_disk(trainer) -> None:
    """Until every checkpoint saved so far is written (they are written in the background)."""
    writer = background_writer(trainer)
    if writer is not None:
        writer.wait()


def pause_until_stopped(trainer) -> None:
    """Write the pause marker once what was saved is on disk, then wait (up to 120 s)
    for a stop signal."""
    on_disk(trainer)
    marker = Path(os.environ["INSTRUMENTS_PAUSE_MARKER"])
    marker.write_text(json.dumps({"global_step": trainer.global_step}))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not stop_requested(trainer):
        time.sleep(0.05)


def kill_during_save(nth: int) -> None:
    """Make the nth torch.save of this process write half its bytes, then SIGKILL it."""
    save, count = torch.save, [0]

    def half_then_kill(obj, file, *args, **kwargs):
        count[0] += 1
        if count[0] < nth:
            return save(obj, file, *args, **kwargs)
        buffer = io.BytesIO()
        save(obj, buffer, *args, **kwargs)
        data = buffer.getvalue()
        file.write(data[: len(data) // 2])
        file.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    torch.save = half_then_kill  # ty: ignore[invalid-assignment]


def slow_train_loader(trainer, seconds: float) -> None:
    """Make each batch of the fit's train loader `seconds` late, inside its iterator (a slow
    disk, as the fit sees it): any loader, and kept if Lightning rebuilds it (its class)."""
    source = trainer.datamodule if trainer.datamodule is not None else trainer.lightning_module
    make = source.train_dataloader

    def late(batches):
        for batch in batches:
            time.sleep(seconds)
            yield batch

    def slowed():
        loader = make()

        class Slow(type(loader)):
            def __iter__(self):
                return late(super().__iter__())

        loader.__class__ = Slow
        return loader

    source.train_dataloader = slowed


def fill_disk(path: Path, leave: int = 0) -> None:
    """Write `path` until its filesystem is full (a small one, in the tests), then give
    back `leave` bytes: room for part of a checkpoint, so that its writer fails half-way."""
    with open(path, "wb", buffering=0) as file:
        try:
            while True:
                file.write(b"\0" * 65536)
        except OSError:
            pass
    os.truncate(path, max(0, path.stat().st_size - leave))


def read_records(prefix: Path, event: str = "epoch_start") -> list[dict]:
    """The records of one event written under `prefix`, all ranks, in file then line order."""
    records = []
    for path in sorted(prefix.parent.glob(f"{prefix.name}-rank*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines()]
    return [record for record in records if record["event"] == event]


def run_command(args: list[str], cwd: str, env: dict, output: str) -> None:
    """Run the project's command in this (forked) process, as `python -m <package>` would.

    The fault tests start runs this way from a fork server that has imported
    Lightning once, instead of paying the import in every new process.
    """
    import sys

    # Ctrl-C raises KeyboardInterrupt, as in a terminal: a run started in the
    # background by a shell (CI scripts, `nohup ... &`) inherits SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(cwd)
    os.environ.clear()  # the environment the command was given, as a new process would have
    os.environ.update(env)
    package = os.environ["INSTRUMENTS_PACKAGE"]
    sys.argv = [package]  # the arguments go to main(), as the command line's would
    for fd, name in ((1, "stdout.txt"), (2, "stderr.txt")):
        with open(Path(output) / name, "a") as file:
            os.dup2(file.fileno(), fd)
    from importlib import import_module

    code = import_module(f"{package}.__main__").main(list(args))
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


def claim_together(package: str, barrier, logger: dict, results) -> None:
    """Wait for the other processes at `barrier`, then claim a run directory (a race)."""
    from importlib import import_module

    claim_new_run = import_module(f"{package}.kit.runs").claim_new_run
    barrier.wait()
    results.put(str(claim_new_run(logger)))
