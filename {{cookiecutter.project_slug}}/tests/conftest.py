"""The fixtures: a scratch working directory, the project, and fits shared by every
test that reads one. What else the tests share is in support/."""

import os
from pathlib import Path

import pytest
import torch
from support import PROJECT, fit_in, shared


def pytest_addoption(parser):
    parser.addoption(
        "--all", action="store_true", help="the slow tests too (a plain pytest runs the quick)"
    )
    parser.addoption(
        "--record-numerics",
        action="store_true",
        help="write the model's numbers to tests/numerics.json (tests/kit/test_numerics.py)",
    )


def pytest_collection_modifyitems(config, items):
    # A plain `pytest` runs the quick tests; `--all` adds the slow ones, `-m slow` runs
    # only those, and a test named by its id runs whatever it is. A full training run
    # is asked for by its marker (`-m target`), never by these.
    asked = config.getoption("markexpr") or ""
    left_out = [] if "target" in asked else ["target"]
    named = any("::" in arg for arg in config.args)
    if not (asked or named or config.getoption("all")):
        left_out.append("slow")
    kept = [item for item in items if not any(map(item.get_closest_marker, left_out))]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; torch.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# What Lightning sets in os.environ when a run in this process takes a distributed strategy:
# the rendezvous, and the CPU threads of each rank (OMP_NUM_THREADS, which also sets
# torch's). A float sum's rounding depends on how many threads share it.
DISTRIBUTED_ENV = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE_RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "OMP_NUM_THREADS",
)


@pytest.fixture(autouse=True)
def no_distributed_state_left():
    """Each test leaves the rendezvous variables, torch's thread count and the default
    process group as it found them: a later run (or its subprocesses) would otherwise
    take an earlier in-process run's for its own, and a run compared with another
    would round differently."""
    saved = {name: os.environ.get(name) for name in DISTRIBUTED_ENV}
    threads = torch.get_num_threads()
    grouped = torch.distributed.is_initialized()
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    torch.set_num_threads(threads)
    if torch.distributed.is_initialized() and not grouped:
        torch.distributed.destroy_process_group()


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


@pytest.fixture(scope="session")
def project():
    """The project under test, as its command runs it (kit/spec.py's Project)."""
    return PROJECT


@pytest.fixture(scope="session")
def trained_checkpoint(request, tmp_path_factory) -> Path:
    """The last.ckpt of a real two-epoch fit, shared by the tests that only read one."""
    folder = shared(
        request, tmp_path_factory, "trained", lambda f: fit_in(f, "--trainer.max_epochs=2")
    )
    (path,) = folder.rglob("last.ckpt")
    return path


@pytest.fixture(scope="session")
def default_fit(request, tmp_path_factory) -> Path:
    """The folder of one full default `fit`, as a user runs it, shared by the tests."""
    return shared(request, tmp_path_factory, "default-fit", fit_in)
