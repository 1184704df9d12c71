"""Fits made once per test session and shared, across pytest-xdist workers too."""

import os
import zlib
from pathlib import Path

from filelock import FileLock

from .processes import run_cli, run_forked
from .project import CONFIGS, main

FLAGS = ("--trainer.max_epochs=2", "--trainer.enable_progress_bar=false")  # two epochs
DDP = (f"--config={CONFIGS / 'ddp.yaml'}", "--trainer.accelerator=cpu", "--trainer.devices=2")
INSTRUMENTS = "--trainer.callbacks+=instruments.Instruments"  # tests/kit/instruments.py
NO_DROPOUT = {"INSTRUMENTS_NO_DROPOUT": "1"}  # no random draws of each process's own


def quiet_trainer(**flags):
    """A one-CPU Trainer that writes and shows nothing (no logger, checkpoints, progress
    bar or summary) unless `flags` for the Trainer say so."""
    from lightning.pytorch import Trainer

    quiet = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    quiet |= dict(enable_model_summary=False, accelerator="cpu", devices=1)
    return Trainer(**(quiet | flags))


def shared(request, tmp_path_factory, name: str, make) -> Path:
    """`make(folder)` once per test session, even across pytest-xdist workers; its folder."""
    if not hasattr(request.config, "workerinput"):  # one process: its own temporary folder
        folder = tmp_path_factory.mktemp(name)
        make(folder)
        return folder
    root = tmp_path_factory.getbasetemp().parent  # shared by this session's workers
    folder = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not (folder / ".done").exists():
            folder.mkdir(exist_ok=True)
            make(folder)
            (folder / ".done").touch()
    return folder


def fit_in(folder: Path, *flags: str) -> None:
    """A default `fit` (no progress bar) run in `folder`, with `flags`."""
    previous = Path.cwd()
    os.chdir(folder)
    try:
        main(["fit", "--trainer.enable_progress_bar=false", *flags])
    finally:
        os.chdir(previous)


def fit_to_end(folder: Path, *args: str, ddp: bool = False, env: dict | None = None):
    """`fit args...` to the end in `folder`: forked, or under DDP (which starts the
    command again for each rank) in a process of its own."""
    return (run_cli if ddp else run_forked)("fit", *args, cwd=folder, env=env)


def reference(request, tmp_path_factory, *flags: str) -> Path:
    """The uninterrupted two-epoch run with `flags`, made once a session; what it printed
    is in its folder (stdout.txt, stderr.txt). With flags (DDP's, or one process's
    accumulation), dropout is off and the instruments record each epoch's order
    (`seen-rank<R>.jsonl`) and the samples of every step (`samples-rank<R>.jsonl`): runs
    resumed on another number of processes are held to it, and runs on its own number
    to it bit for bit."""
    name = f"uninterrupted-{zlib.crc32(' '.join(flags).encode()):08x}"

    def make(folder: Path) -> None:
        if not flags:
            fit_to_end(folder, *FLAGS)
            return
        env = {**NO_DROPOUT, "INSTRUMENTS_SAMPLES": str(folder / "samples")}
        env["INSTRUMENTS_RECORD"] = str(folder / "seen")
        ran = fit_to_end(folder, *FLAGS, *flags, INSTRUMENTS, ddp=DDP[0] in flags, env=env)
        (folder / "stdout.txt").write_text(ran.stdout)
        (folder / "stderr.txt").write_text(ran.stderr)

    return shared(request, tmp_path_factory, name, make)
