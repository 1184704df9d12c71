"""Shared fixtures: the project's configured classes, a scratch working directory,
a CLI subprocess runner, and a trained checkpoint shared by every test that reads one."""

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from filelock import FileLock
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch.utils._pytree import tree_flatten

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CONFIGS = PROJECT_ROOT / "configs"
SRC = PROJECT_ROOT / "src"
TESTS = PROJECT_ROOT / "tests"
PACKAGE = "{{ cookiecutter.package_name }}"
# Timeouts are several times what a step takes on a quiet 2-core machine, so a
# busy one fails no test; none of them is an assertion about speed.
SUBPROCESS_TIMEOUT = 600


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


def configured(*flags: str):
    """The CLI as `fit` would build it, without running: `.model`, `.datamodule`, `.trainer`."""
    from {{ cookiecutter.package_name }}.kit.cli import main

    return main(["--trainer.logger=false", *flags], run=False)


def first_batch(cli, split: str = "train", device: str | torch.device = "cpu"):
    """One batch of the configured DataModule, as the module's steps receive it."""
    datamodule = cli.datamodule
    datamodule.trainer = cli.trainer
    datamodule.prepare_data()
    datamodule.setup("fit" if split in ("train", "val") else split)
    loader = getattr(datamodule, f"{split}_dataloader")()
    return move_data_to_device(next(iter(loader)), torch.device(device))


def same_values(a, b) -> bool:
    """Whether two batches or outputs (tensors, tuples, dicts, lists) hold equal values."""
    flat_a, spec_a = tree_flatten(a)
    flat_b, spec_b = tree_flatten(b)
    return spec_a == spec_b and all(
        torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
        for x, y in zip(flat_a, flat_b, strict=True)
    )


def loader_length(cli, split: str) -> int:
    """How many samples the configured DataModule's `split` loader yields."""
    datamodule = cli.datamodule
    datamodule.trainer = cli.trainer
    datamodule.prepare_data()
    datamodule.setup("fit" if split in ("train", "val") else split)
    return len(getattr(datamodule, f"{split}_dataloader")().dataset)


def cli_env(env: dict | None = None) -> dict:
    """The environment for a CLI subprocess: src/ and tests/ (the instruments) importable."""
    env = {**os.environ, **(env or {})}
{%- if cookiecutter.logger == "mlflow" %}
    env.pop("MLFLOW_TRACKING_URI", None)  # the test's own ./mlruns, not a server or another test's
{%- elif cookiecutter.logger == "wandb" %}
    env.pop("WANDB_SERVICE", None)  # its own W&B service, as a command of its own would have
{%- endif %}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), str(TESTS), env.get("PYTHONPATH")]))
    return env


def run_cli(
    *args: str,
    cwd: Path,
    timeout: float = SUBPROCESS_TIMEOUT,
    check: bool = True,
    env: dict | None = None,
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


SWEEP_MODULES = [
    f"{PACKAGE}.kit.trial",
    "optuna.storages._rdb.storage",
    "optuna.importance",
    "optuna.visualization.matplotlib",
    "matplotlib.pyplot",
]


def forkserver():
    """Processes forked from a server that imported Lightning and the kit once (and what
    a sweep's trials and report import: Optuna, its database and plots)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(
        ["lightning.pytorch", f"{PACKAGE}.kit.cli", "instruments", *SWEEP_MODULES]
    )
    return context


class ForkedRun:
    """A run of the command in a process forked from a server that imported Lightning
    once: a real process (signals, SIGKILL, exit codes), without the import in each."""

    def __init__(self, args: tuple[str, ...], cwd: Path, env: dict | None):
        import instruments

        env = {**(env or {}), "INSTRUMENTS_PACKAGE": PACKAGE}
        self.workdir = cwd
        self.process = forkserver().Process(
            target=instruments.run_command, args=(list(args), str(cwd), env, str(cwd))
        )
        self.process.start()

    def send_signal(self, sent: int) -> None:
        os.kill(self.process.pid, sent)

    def poll(self) -> int | None:
        return self.process.exitcode

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def kill(self) -> None:
        self.process.kill()

    def wait(self, timeout: float = SUBPROCESS_TIMEOUT) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            self.process.kill()
            raise AssertionError(f"the run did not end within {timeout} s")
        return self.process.exitcode

    def output(self) -> subprocess.CompletedProcess:
        """Its exit code and what it printed, as subprocess.run would give them."""
        return subprocess.CompletedProcess(
            self.process.pid,
            self.returncode,
            (self.workdir / "stdout.txt").read_text(),
            (self.workdir / "stderr.txt").read_text(),
        )


def fork_cli(*args: str, cwd: Path, env: dict | None = None) -> ForkedRun:
    """Start `<package> args...` in the background (not for DDP, which re-runs the command)."""
    for name in ("stdout.txt", "stderr.txt"):
        (cwd / name).write_text("")
    return ForkedRun(args, cwd, cli_env(env))


def run_forked(*args: str, cwd: Path, env: dict | None = None, check: bool = True):
    """Run `<package> args...` to the end in a forked process; like run_cli."""
    result = fork_cli(*args, cwd=cwd, env=env)
    result.wait()
    completed = result.output()
    if check and completed.returncode != 0:
        raise AssertionError(failure(f"{PACKAGE} {' '.join(args)}", completed))
    return completed


def wait_for(path: Path, process, timeout: float = SUBPROCESS_TIMEOUT) -> None:
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


{%- if cookiecutter.logger in ("tensorboard", "csv") %}


def run_dirs(root: Path) -> list[Path]:
    """The run directories under `root`, oldest first."""
    runs = (root / "logs").glob("version_*")
    return sorted(runs, key=lambda run: int(run.name.removeprefix("version_")))
{%- endif %}
{%- if cookiecutter.logger == "tensorboard" %}


def logged_scalars(run: Path) -> dict[str, list[float]]:
    """Every scalar the run logged, by name, in logging order (TensorBoard event files)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logged: dict[str, list[float]] = {}
    for events_file in sorted(run.glob("events.out.tfevents.*")):
        events = EventAccumulator(str(events_file))
        events.Reload()
        for tag in events.Tags()["scalars"]:
            logged.setdefault(tag, []).extend(e.value for e in events.Scalars(tag))
    return logged
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
{%- elif cookiecutter.logger == "mlflow" %}


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
{%- else %}


def run_dirs(root: Path) -> list[Path]:
    """The run directories under `root` (logs/<project>/<run id>), oldest first."""
    runs = [run for run in (root / "logs" / "{{ cookiecutter.project_slug }}").glob("*")]
    return sorted(runs, key=lambda run: run.stat().st_mtime)


def wandb_records(path: Path):
    """The protobuf records of a W&B run file (LevelDB's log format, after a 7-byte header)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, position, pending, block = path.read_bytes(), 7, b"", 32768
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def logged_scalars(run: Path) -> dict[str, list[float]]:
    """Every metric the run logged, by name, in logging order (W&B's offline run files)."""
    import json

    logged: dict[str, list[float]] = {}
    files = sorted((run.parent.parent / "wandb").glob(f"offline-run-*-{run.name}/run-*.wandb"))
    for path in files:
        for record in wandb_records(path):
            if record.WhichOneof("record_type") != "history":
                continue
            for item in record.history.item:
                name = item.key or "/".join(item.nested_key)
                if not name.startswith("_") and name not in ("epoch", "trainer/global_step"):
                    logged.setdefault(name, []).append(float(json.loads(item.value_json)))
    return logged
{%- endif %}


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


def _fit_in(folder: Path, *flags: str) -> None:
    from {{ cookiecutter.package_name }}.kit.cli import main

    previous = Path.cwd()
    os.chdir(folder)
    try:
        main(["fit", "--trainer.enable_progress_bar=false", *flags])
    finally:
        os.chdir(previous)


@pytest.fixture(scope="session")
def trained_checkpoint(request, tmp_path_factory) -> Path:
    """The last.ckpt of a real two-epoch fit, shared by the tests that only read one."""
    folder = shared(
        request, tmp_path_factory, "trained", lambda f: _fit_in(f, "--trainer.max_epochs=2")
    )
    (path,) = folder.rglob("last.ckpt")
    return path


@pytest.fixture(scope="session")
def default_fit(request, tmp_path_factory) -> Path:
    """The folder of one full default `fit`, as a user runs it, shared by the tests."""
    return shared(request, tmp_path_factory, "default-fit", _fit_in)


def made_a_run(folder: Path) -> bool:
    """Whether anything a run writes (logs, a config, checkpoints) appeared in `folder`."""
    made = ("logs", "mlruns", "lightning_logs", "checkpoints", "config.yaml")
    return any((folder / name).exists() for name in made)


def folder_of(checkpoint: Path) -> Path:
    """The working directory a run's checkpoint was trained in (it holds logs/ or mlruns/)."""
    return next(p for p in checkpoint.parents if p.name in ("logs", "mlruns")).parent


def load_checkpoint(path: Path) -> dict:
    """A Lightning checkpoint, loaded the safe way (tensors and plain values only)."""
    return torch.load(path, map_location="cpu", weights_only=True)


def best_score(checkpoint: dict) -> float:
    """The monitored metric's best value, as the checkpoint callback recorded it."""
    (state,) = [s for s in checkpoint["callbacks"].values() if "best_model_score" in s]
    return float(state["best_model_score"])


def reached(score: float, target: float, mode: str) -> bool:
    """Whether `score` is at least as good as `target` for a metric where `mode` is better."""
    return score >= target if mode == "max" else score <= target


class FakeClock:
    """A clock that moves only when a test says so: timing logic gets exact numbers,
    whatever the machine's speed. Each process has its own copy (loader workers too)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
