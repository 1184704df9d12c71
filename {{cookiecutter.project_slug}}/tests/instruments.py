"""A callback the fault and DDP tests attach to real runs of the CLI.

    run_cli("fit", "--trainer.callbacks+=instruments.Instruments", env={...})

(`run_cli` puts this folder on PYTHONPATH.) It is set by environment
variables, which DDP's and torchrun's worker processes inherit:

- INSTRUMENTS_RECORD=<prefix>: when training starts (after any resume) and at
  each epoch's start, append one JSON line to `<prefix>-rank<R>.jsonl`: the
  event, rank, world size, epoch, global step, the
  sample indices this rank's sampler yields this epoch, fingerprints of the
  parameters and of the optimizer state, and the schedulers' states;
- INSTRUMENTS_PAUSE_EPOCH=<n> and INSTRUMENTS_PAUSE_MARKER=<file>: at the start
  of epoch n, rank 0 writes the marker and waits there (for a signal); with
  INSTRUMENTS_PAUSE_FIT=<k>, only in the k-th fit (from 0) this process runs
  (a sweep runs one per trial);
- INSTRUMENTS_FAIL_RANK=<r> and INSTRUMENTS_FAIL_STEP=<s>: rank r raises at step s.
"""

import json
import os
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback


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

    def _record(self, trainer, pl_module, event: str) -> None:
        prefix = os.environ.get("INSTRUMENTS_RECORD")
        if not prefix:
            return
        sampler = getattr(trainer.train_dataloader, "sampler", None)
        record = {
            "event": event,
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "epoch": trainer.current_epoch,
            "global_step": trainer.global_step,
            "sampler": type(sampler).__name__,
            "indices": [int(i) for i in sampler] if sampler is not None else None,
            "parameters": parameter_fingerprint(pl_module.state_dict()),
            "optimizers": [optimizer_fingerprint(o.state_dict()) for o in trainer.optimizers],
            "schedulers": [c.scheduler.state_dict() for c in trainer.lr_scheduler_configs],
        }
        with open(f"{prefix}-rank{trainer.global_rank}.jsonl", "a") as file:
            file.write(json.dumps(record, default=repr) + "\n")

    def on_train_start(self, trainer, pl_module) -> None:
        # After a resume: what was restored, before any step of this run.
        self._record(trainer, pl_module, "train_start")

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._record(trainer, pl_module, "epoch_start")
        pause = os.environ.get("INSTRUMENTS_PAUSE_EPOCH")
        fit = os.environ.get("INSTRUMENTS_PAUSE_FIT")
        if fit is not None and self.fit_index != int(fit):
            pause = None
        if pause and trainer.current_epoch == int(pause) and trainer.global_rank == 0:
            marker = Path(os.environ["INSTRUMENTS_PAUSE_MARKER"])
            marker.write_text(json.dumps({"global_step": trainer.global_step}))
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not trainer.received_sigterm:
                time.sleep(0.05)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        rank = os.environ.get("INSTRUMENTS_FAIL_RANK")
        step = os.environ.get("INSTRUMENTS_FAIL_STEP")
        if rank and trainer.global_rank == int(rank) and trainer.global_step == int(step):
            raise RuntimeError(f"injected fault on rank {rank} at step {step}")


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

    os.chdir(cwd)
    os.environ.update(env)
    for fd, name in ((1, "stdout.txt"), (2, "stderr.txt")):
        with open(Path(output) / name, "a") as file:
            os.dup2(file.fileno(), fd)
    from importlib import import_module

    package = os.environ["INSTRUMENTS_PACKAGE"]
    code = import_module(f"{package}.__main__").main(list(args))
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)
