"""What a user does after rendering: install it, run its command, run its tests."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import env_without_mlflow_uri, python, render, run


def passed_count(pytest_output: str) -> int:
    match = re.search(r"(\d+) passed", pytest_output)
    return int(match.group(1)) if match else 0


# Four renders: together they run every logger, both examples, and the project
# with and without its optional files. The default runs its whole suite; the
# minimal example the quick tests of its own model and data, its logger and the
# files it goes without (the five ports of test_replacements.py run every quick
# test on other models); the other loggers the quick tests of what a logger
# changes. Each then runs the slow tests its options change (the fit to the
# example's target, resume into the logger's run, DDP's single run directory, a
# sweep's trials).
SIGKILL = "tests/kit/test_faults.py::test_resume_after_sigkill_continues_from_the_last_checkpoint"
# A sweep on a lower-is-better metric; one continued after a kill, in the logger's own runs.
SHORT_SWEEP = "tests/kit/test_sweep.py::test_a_short_sweep_completes_prunes_and_reports"
STOPPED_SWEEP = "tests/kit/test_sweep.py::test_a_stopped_sweep_continues_its_study"
# Exact resumes of another model and data: a run killed (twice), one stopped in-process.
RESUMES = [
    "tests/kit/test_resume.py::test_a_killed_run_resumes_exactly_from_its_newest_checkpoint",
    "tests/kit/test_resume.py::test_an_in_process_fit_stopped_and_resumed_is_exact",
]
# An evaluation logged into the run it evaluates; a resume past a damaged last.ckpt.
INTO_ITS_RUN = "tests/kit/test_cli.py::test_validate_and_test_the_best_checkpoint_into_its_run"
DAMAGED_NEWEST = (
    "tests/kit/test_checkpoints.py::test_resume_skips_a_damaged_newest_checkpoint_and_says_why"
)
# The tests that read or write a logger's runs (the train loss reaches each logger
# without a host sync between logging steps).
LOGGER_TESTS = [
    "tests/kit/test_cli.py",
    "tests/kit/test_runs.py",
    "tests/kit/test_bad_input.py",
    "tests/kit/test_syncs.py",
]
# The minimal example: its own tests, its numbers, what reads its data and builds its
# model, and what its options (CSV, no cluster files, no CI, no license) change.
MINIMAL = [
    "tests/test_example.py",
    "tests/kit/test_numerics.py",
    "tests/kit/test_model.py",
    "tests/kit/test_data.py",
    "tests/kit/test_export.py",
    "tests/kit/test_imports.py",
    *LOGGER_TESTS,
]
# The renders whose full default fit is held to the example's target (`-m target`).
TO_TARGET = {"digits-tensorboard-every-option", "minimal-csv-no-cluster-no-ci-no-license"}
SUITES = {
    "digits-tensorboard-every-option": ({}, None, None),
    "minimal-csv-no-cluster-no-ci-no-license": (
        {"example": "minimal", "logger": "csv", "cluster": False, "ci": False, "license": "none"},
        MINIMAL,
        ["tests/kit/test_cli.py", SIGKILL, SHORT_SWEEP, *RESUMES],
    ),
    "digits-mlflow": (
        {"logger": "mlflow"},
        [*LOGGER_TESTS, "tests/kit/test_checkpoints.py"],
        [INTO_ITS_RUN, "tests/kit/test_ddp.py", SIGKILL, STOPPED_SWEEP],
    ),
    # W&B offline: its runs, records and continued runs.
    "digits-wandb": (
        {"logger": "wandb", "cluster": False, "ci": False},
        [*LOGGER_TESTS, "tests/kit/test_checkpoints.py"],
        [INTO_ITS_RUN, "tests/kit/test_runs.py", DAMAGED_NEWEST, SIGKILL],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("suite", "answers", "quick", "slow"), [(k, *v) for k, v in SUITES.items()], ids=SUITES.keys()
)
def test_rendered_project_passes_its_own_test_suite(tmp_path, suite, answers, quick, slow):
    project = render(tmp_path, **answers)
    env = env_without_mlflow_uri()
    # One process each, but two for the whole suite: its tests wait on subprocesses,
    # signals and timeouts, and this suite's other worker runs the rest meanwhile.
    workers = "2" if quick is None else "0"
    pytest_ = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", workers]
    runs = [[*pytest_, "--all"]]
    if slow:
        runs = [[*pytest_, "-m", "not slow", *quick], [*pytest_, "-m", "slow", *slow]]
    if suite in TO_TARGET:
        runs.append([*pytest_, "-m", "target"])
    outputs = [run(command, cwd=project, timeout=1200, env=env).stdout for command in runs]
    output = "\n".join(outputs)
    # Every CPU test ran and passed; only the GPU ones may skip, with a reason.
    assert not re.search(r"\d+ (failed|errors?)\b", output), output[-3000:]
    assert sum(passed_count(out) for out in outputs) >= (100 if quick is None else 20), output[
        -3000:
    ]
    if suite in TO_TARGET:  # the fit to the target ran, and only when asked for
        assert passed_count(outputs[-1]) >= 1 and "target" not in " ".join(runs[0]), outputs[-1]
    skipped = re.findall(r"SKIPPED \[\d+\] \S+: (.*)", output)
    if not torch.cuda.is_available():
        # The GPU config's fast_dev_run (in test_cli.py), the GPU fit and the pinned copy
        # of a checkpoint's state (test_gpu.py), nothing else.
        gpu = ["needs a CUDA device; torch.cuda.is_available() is False"]
        expected = 3 if slow is None else int("tests/kit/test_cli.py" in quick)
        assert skipped == gpu * expected


@pytest.mark.slow
def test_a_one_line_change_to_the_models_forward_fails_the_numerics_test(tmp_path):
    """tests/numerics.json pins the example's numbers: a changed forward fails with the
    tensor that moved first. (test_readme.py records them again as the docs say; the
    ports' quick runs record their own and hold them.)"""
    project = render(tmp_path)
    model = project / "src" / "my_lightning_project" / "model.py"
    line = "return self.head(self.features((x - self.mean) / self.std))"
    assert line in model.read_text()
    model.write_text(model.read_text().replace(line, line.replace("x - self.mean", "x")))
    test = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0"]
    result = subprocess.run(
        [*test, "tests/kit/test_numerics.py"], cwd=project, capture_output=True, text=True
    )
    assert result.returncode == 1, result.stdout[-3000:]
    # The first line that names it: pytest's summary may repeat it, cut to the terminal.
    message = re.search(r"AssertionError: (the model's numbers moved: .*)", result.stdout)[1]
    assert message.startswith("the model's numbers moved: network output 0: mean"), message
    assert message.endswith(
        "If that is meant: `pytest tests/kit/test_numerics.py --record-numerics`, and commit"
        " tests/numerics.json"
    )


@pytest.mark.slow
def test_a_model_of_another_class_is_recorded_outside_ci_and_named_in_ci(tmp_path):
    """The example replaced by a model of another class (renamed here): a first `pytest`
    records its numbers and says so; under CI (the CI variable set) it fails instead, with
    the command that records them."""
    project = render(tmp_path)
    package = project / "src" / "my_lightning_project"
    for name in ("model.py", "project.py"):
        path = package / name
        path.write_text(path.read_text().replace("DigitsClassifier", "MyClassifier"))
    test = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0"]
    numerics = [*test, "tests/kit/test_numerics.py::test_the_models_numbers_are_the_recorded_ones"]
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    ci = subprocess.run(
        numerics, cwd=project, capture_output=True, text=True, env={**env, "CI": "true"}
    )
    assert ci.returncode == 1, ci.stdout[-3000:]
    assert "records model.DigitsClassifier, project.py names model.MyClassifier" in ci.stdout
    assert "`pytest tests/kit/test_numerics.py --record-numerics`, and commit" in ci.stdout
    local = subprocess.run(numerics, cwd=project, capture_output=True, text=True, env=env)
    assert local.returncode == 0, local.stdout[-3000:]
    assert "project.py names model.MyClassifier, whose numbers it now records" in local.stdout
    record = json.loads((project / "tests" / "numerics.json").read_text())
    assert record["model"] == "model.MyClassifier"
    again = subprocess.run(numerics, cwd=project, capture_output=True, text=True, env=env)
    assert again.returncode == 0 and "now records" not in again.stdout


@pytest.mark.gpu
@pytest.mark.slow
def test_rendered_project_fits_on_gpu(tmp_path):
    project = render(tmp_path)
    result = python(
        "-m",
        "my_lightning_project",
        "fit",
        "--config",
        "configs/gpu.yaml",
        "--trainer.max_epochs",
        "10",
        cwd=project,
        PYTHONPATH=str(project / "src"),
        timeout=600,
    )
    assert "CUDAAccelerator" in result.stderr and "bf16-mixed" in result.stderr
    (best,) = (project / "logs" / "version_0" / "checkpoints").glob("best-*.ckpt")
    state = torch.load(best, map_location="cpu", weights_only=True)
    (checkpoint_state,) = [s for s in state["callbacks"].values() if "best_model_score" in s]
    assert float(checkpoint_state["best_model_score"]) >= 0.97
    python("-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", cwd=project)
