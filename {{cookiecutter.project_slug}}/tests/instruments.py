"""A callback the fault and DDP tests attach to real runs of the CLI.

    run_cli("fit", "--trainer.callbacks+=instruments.Instruments", env={...})

(`run_cli` puts this folder on PYTHONPATH.) It is set by environment
variables, which DDP's and torchrun's worker processes inherit:

- INSTRUMENTS_RECORD=<prefix>: when training starts (after any resume) and at
  each epoch's start, append one JSON line to `<prefix>-rank<R>.jsonl`: the
  event, rank, world size, epoch, global step, the
  sample indices this rank's sampler yields this epoch, and a fingerprint of
  the optimizer state and the scheduler's step count;
- INSTRUMENTS_PAUSE_EPOCH=<n> and INSTRUMENTS_PAUSE_MARKER=<file>: at the start
  of epoch n, rank 0 writes the marker and waits there (for a signal);
- INSTRUMENTS_FAIL_RANK=<r> and INSTRUMENTS_FAIL_STEP=<s>: rank r raises at step s.
"""

import json
import os
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback


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


class Instruments(Callback):
    def _record(self, trainer, event: str) -> None:
        prefix = os.environ.get("INSTRUMENTS_RECORD")
        if not prefix:
            return
        sampler = getattr(trainer.train_dataloader, "sampler", None)
        schedulers = trainer.lr_scheduler_configs
        record = {
            "event": event,
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "epoch": trainer.current_epoch,
            "global_step": trainer.global_step,
            "sampler": type(sampler).__name__,
            "indices": [int(i) for i in sampler] if sampler is not None else None,
            "optimizer": optimizer_fingerprint(trainer.optimizers[0].state_dict()),
            "scheduler_steps": schedulers[0].scheduler.last_epoch if schedulers else None,
        }
        with open(f"{prefix}-rank{trainer.global_rank}.jsonl", "a") as file:
            file.write(json.dumps(record) + "\n")

    def on_train_start(self, trainer, pl_module) -> None:
        # After a resume: what was restored, before any step of this run.
        self._record(trainer, "train_start")

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._record(trainer, "epoch_start")
        pause = os.environ.get("INSTRUMENTS_PAUSE_EPOCH")
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
