"""Replace the example with problems of other shapes; the kit's tests pass unchanged.

Each problem in `replacements/` is what a user writes: `project.py`, `model.py`
and `data.py`, and configs of its own in `configs/` where it has some. It is
copied into a fresh render, the example's own tests are
deleted, and the kit's tests run with no edit anywhere else (its model's numbers
recorded in place of the example's, as the README says): the quick ones,
and the slow ones that touch what differs from the example (a fit to the
problem's own target, evaluation and predictions, an exact resume, DDP, FSDP).
The newer problems are rendered under names of their own (their imports inside
the package are relative), so nothing of the kit or its tests may depend on the
project's name, command or package. A problem whose exports leave the sequence
length free is exported and run on another length.
"""

import re
import shutil
import sys
from pathlib import Path

import pytest
from conftest import env_without_mlflow_uri, python, render, run

REPLACEMENTS = Path(__file__).parent / "replacements"
USER_FILES = ("project.py", "model.py", "data.py")
RESUME = "tests/kit/test_resume.py"
STOPPED_MID_EPOCH = "test_with_any_loader_workers_a_run_stopped_mid_epoch_resumes_exactly"
OTHER_NUMBER = "test_a_run_resumed_on_another_number_of_processes_trains_the_same_samples"
# Each problem: the project name it is rendered under, and, beyond the quick tests,
# the slow kit tests that put its traits to work.
PROBLEMS = {
    "text": (None, ["tests/kit/test_cli.py", "tests/kit/test_ddp.py"]),  # dict batches under DDP
    # an exact resume with an optimizer that keeps no state, on a lower-is-better metric
    "tabular": (
        None,
        ["tests/kit/test_faults.py::test_resume_after_sigkill_continues_from_the_last_checkpoint"],
    ),
    "transformer": (None, []),  # the quick ones: its network is another's, its data the demo's
    # Manual optimization, two networks and two optimizers: DDP (the parameters each
    # backward leaves out), a refusal on both ranks of an FSDP job, an exact resume of a
    # model whose weights depend on every random state. (FSDP wrapping both networks
    # while export writes one: a quick kit test, on one rank.)
    "gan": (
        "Ring GAN",
        [
            "tests/kit/test_ddp.py",
            "tests/kit/test_fsdp.py::test_a_refusal_on_every_rank_is_one_line_for_the_job",
            f"{RESUME}::test_an_in_process_fit_stopped_and_resumed_is_exact[dropout mid-epoch]",
        ],
    ),
    # PNG files written by prepare_data, read by loader workers, augmented from torch's,
    # NumPy's and Python's generators: exact resumes after SIGTERM mid-epoch with no
    # workers (the main process draws) and after SIGKILL with two (the workers draw, and
    # end with their run); bench writes nothing of its own beside the data.
    "images": (
        "Shape Lab",
        [
            f"{RESUME}::{STOPPED_MID_EPOCH}[SIGTERM-no workers]",
            f"{RESUME}::{STOPPED_MID_EPOCH}[SIGKILL-2 workers]",
            "tests/kit/test_bench.py::test_bench_measures_the_project_and_writes_nothing",
        ],
    ),
    # A stream split by loader workers and ranks: each rank its own share of each epoch,
    # a SIGKILL mid-epoch resumed exactly (the stream read again up to where it stopped),
    # and 2 processes to 1 said to train other samples.
    "stream": (
        "Signal Stream",
        [
            "tests/kit/test_ddp.py",
            f"{RESUME}::{STOPPED_MID_EPOCH}[SIGKILL-2 workers]",
            f"{RESUME}::{OTHER_NUMBER}[2 to 1]",
        ],
    ),
    # A batch sampler of the user's, dealt out to the ranks: none of its batches on two
    # ranks; a SIGTERM mid-epoch resumed exactly; 1 process to 2 said to differ.
    "buckets": (
        "Point Sets",
        [
            "tests/kit/test_ddp.py",
            f"{RESUME}::{STOPPED_MID_EPOCH}[SIGTERM-no workers]",
            f"{RESUME}::{OTHER_NUMBER}[1 to 2]",
        ],
    ),
    # A frozen backbone, its last block unfrozen at epoch 1 by Lightning's BaseFinetuning,
    # two validation loaders, Lightning's EMA in configs/default.yaml: the ranks' weights
    # alike under DDP, resumes in the unfreezing epoch exact, FSDP refused in one line.
    "finetune": (
        "Blob Tuner",
        [
            "tests/kit/test_ddp.py",
            f"{RESUME}::{STOPPED_MID_EPOCH}[SIGTERM-no workers]",
            f"{RESUME}::test_an_in_process_fit_stopped_and_resumed_is_exact[dropout mid-epoch]",
            "tests/kit/test_fsdp.py::test_a_refusal_on_every_rank_is_one_line_for_the_job",
        ],
    ),
    # OneCycleLR over the Trainer's estimated steps: resumed exactly mid-epoch and at an
    # epoch's end, under DDP on its own share; continuing past its steps refused in a line.
    "onecycle": (
        "Tumour Cycle",
        [
            "tests/kit/test_ddp.py",
            f"{RESUME}::test_an_in_process_fit_stopped_and_resumed_is_exact",
        ],
    ),
}
# The problems whose Project.dynamic_dims frees the sequence length: their .pt2 and .onnx
# exports run on sequences of another length (replacements/other_length.py checks).
# The transformer's network cannot be traced at all (replacements/README.md).
FREE_LENGTH = {"text"}


def counts(output: str) -> dict[str, int]:
    found = re.findall(r"(\d+) (passed|failed|errors?|skipped)", output)
    return {word: int(n) for n, word in found}


def port(tmp_path: Path, problem: str) -> Path:
    """A fresh render (under the problem's own name, if it has one) with the problem's
    user files in place of the example's, and without the example's tests."""
    name, _ = PROBLEMS[problem]
    project = render(tmp_path, **({"project_name": name} if name else {}))
    (package,) = [p for p in (project / "src").iterdir() if (p / "__main__.py").is_file()]
    for file in USER_FILES:
        shutil.copy(REPLACEMENTS / problem / file, package / file)
    for config in (REPLACEMENTS / problem).glob("configs/*.yaml"):  # the user's configs
        shutil.copy(config, project / "configs" / config.name)
    (project / "tests" / "test_example.py").unlink()
    return project


@pytest.mark.slow
@pytest.mark.parametrize("problem", sorted(PROBLEMS))
def test_the_kit_tests_pass_for_another_problem(tmp_path, problem):
    project = port(tmp_path, problem)
    python("-m", "ruff", "check", "--no-cache", ".", cwd=project)
    python("-m", "ruff", "format", "--check", "--no-cache", ".", cwd=project)
    python("-m", "ty", "check", "--python", sys.executable, cwd=project)  # as its CI would
    env = env_without_mlflow_uri()
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-rs"]
    if problem in FREE_LENGTH:
        workdir = project / "other-length"
        workdir.mkdir()
        script = str(REPLACEMENTS / "other_length.py")
        src = str(project / "src")
        result = run([sys.executable, script], cwd=workdir, env=env, PYTHONPATH=src)
        assert "pt2: length" in result.stdout and "onnx: length" in result.stdout, result.stdout
        shutil.rmtree(workdir)
    slow = PROBLEMS[problem][1]
    # The quick tests record this model's numbers in place of the example's, as a user
    # does (README, "Make it yours"); the numerics test then holds its own to them.
    quick = run(
        [*pytest, "-m", "not slow", "--record-numerics"], cwd=project, env=env, timeout=1200
    )
    results = [quick]
    if slow:
        results.append(run([*pytest, "-m", "slow", *slow], cwd=project, env=env, timeout=1200))
    for result in results:
        found = counts(result.stdout)
        assert not found.get("failed") and not found.get("error"), result.stdout[-4000:]
    assert counts(quick.stdout)["passed"] >= 80, quick.stdout[-2000:]
    if slow:
        assert counts(results[1].stdout)["passed"] >= len(slow), results[1].stdout[-2000:]
    # Skips only for a GPU, or with a reason that names what the problem lacks.
    skipped = re.findall(r"SKIPPED \[\d+\] \S+: (.*)", "\n".join(r.stdout for r in results))
    known = (
        "needs a CUDA device",
        "the step reads tensor values",
        "this project's network is",
        "the project's",  # what it keeps, which a config refuses in one line
    )
    assert all(reason.startswith(known) for reason in skipped), skipped
