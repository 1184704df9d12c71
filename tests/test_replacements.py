"""Replace the example with problems of other shapes; the kit's tests pass unchanged.

Each problem in `replacements/` is what a user writes: `project.py`, `model.py`
and `data.py`. It is copied into a fresh render, the example's own tests are
deleted, and the kit's tests run with no edit anywhere else: the quick ones,
and the slow ones that touch what differs from the example (a fit to the
problem's own target, evaluation and predictions, an exact resume, DDP). A problem
whose exports leave the sequence length free is exported and run on another length.
"""

import re
import shutil
import sys
from pathlib import Path

import pytest
from conftest import env_without_mlflow_uri, python, render, run

REPLACEMENTS = Path(__file__).parent / "replacements"
USER_FILES = ("project.py", "model.py", "data.py")
# Beyond the quick tests: the slow kit tests each problem puts to work.
SLOW = {
    "text": ["tests/test_cli.py", "tests/test_ddp.py"],  # dict batches under DDP
    # an exact resume with an optimizer that keeps no state, on a lower-is-better metric
    "tabular": [
        "tests/test_faults.py::test_resume_after_sigkill_continues_from_the_last_checkpoint"
    ],
    "transformer": [],  # the quick ones: its network is another's, its data the demo's
}
# The problems whose Project.dynamic_dims frees the sequence length: their .pt2 and .onnx
# exports run on sequences of another length (replacements/other_length.py checks).
# The transformer's network cannot be traced at all (replacements/README.md).
FREE_LENGTH = {"text"}


def counts(output: str) -> dict[str, int]:
    found = re.findall(r"(\d+) (passed|failed|errors?|skipped)", output)
    return {word: int(n) for n, word in found}


@pytest.mark.slow
@pytest.mark.parametrize("problem", sorted(SLOW))
def test_the_kit_tests_pass_for_another_problem(tmp_path, problem):
    project = render(tmp_path)
    package = project / "src" / "my_lightning_project"
    for name in USER_FILES:
        shutil.copy(REPLACEMENTS / problem / name, package / name)
    (project / "tests" / "test_example.py").unlink()
    python("-m", "ruff", "check", "--no-cache", ".", cwd=project)
    env = env_without_mlflow_uri()
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0"]
    if problem in FREE_LENGTH:
        workdir = project / "other-length"
        workdir.mkdir()
        script = str(REPLACEMENTS / "other_length.py")
        src = str(project / "src")
        result = run([sys.executable, script], cwd=workdir, env=env, PYTHONPATH=src)
        assert "pt2: length" in result.stdout and "onnx: length" in result.stdout, result.stdout
        shutil.rmtree(workdir)
    quick = run([*pytest, "-m", "not slow"], cwd=project, env=env, timeout=1200)
    results = [quick]
    if SLOW[problem]:
        results.append(
            run([*pytest, "-m", "slow", *SLOW[problem]], cwd=project, env=env, timeout=1200)
        )
    for result in results:
        found = counts(result.stdout)
        assert not found.get("failed") and not found.get("error"), result.stdout[-4000:]
    assert counts(quick.stdout)["passed"] >= 80, quick.stdout[-2000:]
    if SLOW[problem]:
        assert counts(results[1].stdout)["passed"] >= 1, results[1].stdout[-2000:]
