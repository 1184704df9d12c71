"""Shared fixtures: a scratch working directory and a CLI subprocess runner."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CONFIGS = PROJECT_ROOT / "configs"
SRC = PROJECT_ROOT / "src"
TESTS = PROJECT_ROOT / "tests"
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


{%- if cookiecutter.logger == "mlflow" %}


@pytest.fixture(autouse=True)
def own_mlflow_store(monkeypatch):
    """Each test logs into its own directory's store: MLflow exports the URI of the
    last store it used as MLFLOW_TRACKING_URI, which would carry over (and one set
    for your own server must not receive test runs)."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
{%- endif %}


def cli_env(env: dict | None = None) -> dict:
    """The environment for a CLI subprocess: src/ and tests/ (the instruments) importable."""
    env = {**os.environ, **(env or {})}
{%- if cookiecutter.logger == "mlflow" %}
    env.pop("MLFLOW_TRACKING_URI", None)  # the test's own ./mlruns, not a server or another test's
{%- endif %}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), str(TESTS), env.get("PYTHONPATH")]))
    return env


def run_cli(
    *args: str, cwd: Path, timeout: float = 300, check: bool = True, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`python -m <package> args...` in a fresh process (needed for DDP).

    With `check`, a non-zero exit fails the test with the command's output.
    """
    result = subprocess.run(
        [sys.executable, "-m", PACKAGE, *args],
        cwd=cwd,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(failure(f"{PACKAGE} {' '.join(args)}", result))
    return result


def failure(command: str, result) -> str:
    """A readable account of a failed subprocess, for assertion messages."""
    return (
        f"{command} exited {result.returncode}\n"
        f"--- stdout ---\n{result.stdout[-4000:]}\n--- stderr ---\n{result.stderr[-8000:]}"
    )


def start_cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.Popen:
    """`python -m <package> args...` started in the background, output to files in `cwd`."""
    process = subprocess.Popen(
        [sys.executable, "-m", PACKAGE, *args],
        cwd=cwd,
        env=cli_env(env),
        stdout=open(cwd / "stdout.txt", "w"),  # noqa: SIM115 (closed with the process)
        stderr=open(cwd / "stderr.txt", "w"),  # noqa: SIM115
        text=True,
    )
    process.workdir = cwd
    return process


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 300) -> None:
    """Wait until `path` exists; fail early, with the output, if `process` ends first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(
                f"the run ended (exit {process.returncode}) before {path.name} appeared\n"
                + (process.workdir / "stderr.txt").read_text()[-8000:]
            )
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"{path.name} did not appear within {timeout} s")
        time.sleep(0.05)


{%- if cookiecutter.logger != "mlflow" %}


def run_dirs(root: Path) -> list[Path]:
    """The run directories the logger made under `root`, oldest first."""
    runs = (root / "logs" / "{{ cookiecutter.example }}").glob("version_*")
    return sorted(runs, key=lambda run: int(run.name.removeprefix("version_")))
{%- endif %}
{%- if cookiecutter.logger == "tensorboard" %}


def logged_scalars(run: Path) -> dict[str, list[float]]:
    """Every scalar the run logged, by name, in logging order (TensorBoard event files)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run))
    events.Reload()
    return {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
{%- elif cookiecutter.logger == "csv" %}


def logged_scalars(run: Path) -> dict[str, list[float]]:
    """Every scalar the run logged, by name, in logging order (the run's metrics.csv)."""
    import csv

    logged: dict[str, list[float]] = {}
    with open(run / "metrics.csv", newline="") as file:
        for row in csv.DictReader(file):
            for name, value in row.items():
                if name not in ("epoch", "step") and value != "":
                    logged.setdefault(name, []).append(float(value))
    return logged
{%- else %}


def run_dirs(root: Path) -> list[Path]:
    """The runs MLflow made in the local store under `root`, oldest first."""
    runs = [run for run in (root / "mlruns").glob("*/*") if (run / "meta.yaml").is_file()]
    return sorted(runs, key=lambda run: (run / "meta.yaml").stat().st_mtime)


def logged_scalars(run: Path) -> dict[str, list[float]]:
    """Every metric the run logged, by name, in logging order (lines of `timestamp value step`)."""
    metrics = run / "metrics"
    return {
        file.relative_to(metrics).as_posix(): [
            float(line.split()[1]) for line in file.read_text().splitlines()
        ]
        for file in sorted(metrics.rglob("*"))
        if file.is_file()
    }
{%- endif %}


@pytest.fixture(scope="session")
def trained_checkpoint(tmp_path_factory) -> Path:
    """The last.ckpt of a real two-epoch fit, shared by the tests that only read one."""
    root = tmp_path_factory.mktemp("trained")
    from {{ cookiecutter.package_name }}.cli import main

    main(
        [
            "fit",
            "--trainer.max_epochs=2",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={root}",
            f"--trainer.logger.init_args.save_dir={root}",
        ]
    )
    (path,) = root.rglob("last.ckpt")
    return path


def load_checkpoint(path: Path) -> dict:
    """A Lightning checkpoint, loaded the safe way (tensors and plain values only)."""
    return torch.load(path, map_location="cpu", weights_only=True)
