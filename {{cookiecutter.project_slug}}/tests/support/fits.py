"""Fits made once per test session and shared, across pytest-xdist workers too."""

import os
from pathlib import Path

from filelock import FileLock

from .project import main


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
