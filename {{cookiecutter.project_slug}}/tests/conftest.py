"""Shared fixtures: a scratch working directory and a CLI subprocess runner."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CONFIGS = PROJECT_ROOT / "configs"
SRC = PROJECT_ROOT / "src"
PACKAGE = "{{ cookiecutter.package_name }}"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; torch.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """Run in an empty directory, so `logs/` and checkpoints land there."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_cli(
    *args: str, cwd: Path, timeout: float = 300, check: bool = True, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`python -m <package> args...` in a fresh process (needed for DDP).

    With `check`, a non-zero exit fails the test with the command's output.
    """
    env = {**os.environ, **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-m", PACKAGE, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{PACKAGE} {' '.join(args)} exited {result.returncode}\n"
            f"--- stdout ---\n{result.stdout[-4000:]}\n--- stderr ---\n{result.stderr[-8000:]}"
        )
    return result


def load_checkpoint(path: Path) -> dict:
    """A Lightning checkpoint, loaded the safe way (tensors and plain values only)."""
    return torch.load(path, map_location="cpu", weights_only=True)
