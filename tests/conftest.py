"""Render the template into temporary folders and look at what came out."""

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cookiecutter.main import cookiecutter

TEMPLATE = Path(__file__).resolve().parents[1]


# The longest tests, longest first (each runs a rendered project's suite). Each worker
# starts its share of the collection (xdist's worksteal hands worker k the k-th of
# equal slices) with its share of these: none is left to run alone at the end.
LONGEST = (
    "suite[digits-tensorboard-every-option]",
    "test_the_wheelhouse_installs",
    "test_the_kit_on_the_newest_releases",
    "problem[images]",
    "problem[finetune]",
    "problem[stream]",
    "suite[minimal-csv",
    "test_every_command_of_the_rendered_readme",
    "test_fit_resume_and_predict_print_what_docs_train_md_shows",
    "problem[transformer]",
    "problem[text]",
    "problem[gan]",
    "problem[tabular]",
    "problem[buckets]",
    "problem[onecycle]",
    "suite[digits-mlflow]",
    "suite[digits-wandb]",
)


def rank(item) -> int:
    return next((n for n, name in enumerate(LONGEST) if name in item.nodeid), len(LONGEST))


def longest_first(items: list, workers: int) -> list:
    """`items` in worker-sized slices, each led by its turn of the longest tests."""
    long = sorted((item for item in items if rank(item) < len(LONGEST)), key=rank)
    rest = iter(item for item in items if rank(item) == len(LONGEST))
    ordered, left = [], len(items)
    for worker in range(workers):
        size = left // (workers - worker)  # as worksteal slices what is left
        mine = long[worker::workers]
        mine += itertools.islice(rest, max(0, size - len(mine)))
        ordered += mine
        left -= len(mine)
    return ordered + list(rest)


def pytest_collection_modifyitems(config, items):
    import torch

    items[:] = longest_first(items, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; torch.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def render(output_dir: Path, **answers: str) -> Path:
    """Render with `answers` over the defaults, no prompts; return the project dir."""
    return Path(
        cookiecutter(
            str(TEMPLATE),
            no_input=True,
            extra_context=answers,
            output_dir=str(output_dir),
        )
    )


def watched(cmd: list[str], cwd: Path, env: dict, silent_for: float) -> subprocess.CompletedProcess:
    """Run `cmd` with its output captured. A slow machine is not a failure: only a
    command that writes nothing for `silent_for` seconds is stopped, with its children,
    as hung. (Python's children write unbuffered, so a test suite's progress counts.)"""
    process = subprocess.Popen(
        cmd,
        cwd=cwd,
        env={**env, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, to stop it whole
    )
    last = [time.monotonic()]
    chunks: dict[int, list[bytes]] = {1: [], 2: []}

    def pump(stream, into: list[bytes]) -> None:
        while chunk := os.read(stream.fileno(), 65536):
            into.append(chunk)
            last[0] = time.monotonic()

    pumps = [
        threading.Thread(target=pump, args=(process.stdout, chunks[1]), daemon=True),
        threading.Thread(target=pump, args=(process.stderr, chunks[2]), daemon=True),
    ]
    for thread in pumps:
        thread.start()
    hung = False
    try:
        while process.poll() is None:
            if time.monotonic() - last[0] > silent_for:
                hung = True
                break
            time.sleep(0.5)
    finally:  # hung, or the test itself stopped: nothing of it outlives the test
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        for thread in pumps:
            thread.join(timeout=10)
    stdout, stderr = (b"".join(chunks[n]).decode(errors="replace") for n in (1, 2))
    if hung:
        raise AssertionError(
            f"{' '.join(cmd)} wrote nothing for {silent_for:.0f} s in {cwd}: stopped as hung\n"
            f"--- stdout ---\n{stdout[-6000:]}\n--- stderr ---\n{stderr[-6000:]}"
        )
    return subprocess.CompletedProcess(cmd, process.returncode, stdout, stderr)


def run(
    cmd: list[str], cwd: Path, timeout: float = 600, env: dict | None = None, **more_env: str
) -> subprocess.CompletedProcess:
    """Run `cmd` (in `env`, default this one's, plus `more_env`), failing with its
    output if it exits non-zero, or if it writes nothing for `timeout` seconds."""
    result = watched(cmd, cwd, {**(os.environ if env is None else env), **more_env}, timeout)
    if result.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {result.returncode} in {cwd}\n"
            f"--- stdout ---\n{result.stdout[-6000:]}\n--- stderr ---\n{result.stderr[-6000:]}"
        )
    return result


def env_without_mlflow_uri() -> dict:
    """This environment minus MLFLOW_TRACKING_URI, so an MLflow project logs into its
    own ./mlruns, never into a server or another test's store."""
    return {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}


def python(*args: str, cwd: Path, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    return run([sys.executable, *args], cwd=cwd, timeout=timeout, **env)
