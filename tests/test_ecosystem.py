"""The rendered project among the tools around it: cruft, pre-commit, each
logger's own files, and the dependency bounds it declares."""

import json
import os
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from conftest import TEMPLATE, render, run
from packaging.requirements import Requirement

BIN = Path(sys.executable).parent
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.com",
}


def git(*args: str, cwd: Path):
    return run(["git", *args], cwd=cwd, **GIT_IDENTITY)


def commit_all(repo: Path, message: str) -> None:
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", message, cwd=repo)


def template_repository(path: Path) -> Path:
    """A copy of this template as its own git repository, as cruft clones one."""
    shutil.copytree(
        TEMPLATE,
        path,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "__pycache__", ".ruff_cache", ".pytest_cache"
        ),
    )
    git("init", "-q", "-b", "main", cwd=path)
    commit_all(path, "template")
    return path


def files_and_bytes(project: Path) -> dict[str, bytes]:
    return {
        p.relative_to(project).as_posix(): p.read_bytes()
        for p in project.rglob("*")
        if p.is_file() and ".git" not in p.relative_to(project).parts
    }


@pytest.mark.slow
def test_cruft_creates_the_same_project_and_updates_it_keeping_user_edits(tmp_path):
    template = template_repository(tmp_path / "template")
    answers = {"project_name": "Digit Lab", "cluster": False, "license": "BSD-3-Clause"}
    (tmp_path / "out").mkdir()
    run(
        [str(BIN / "cruft"), "create", str(template), "--no-input"]
        + ["--output-dir", str(tmp_path / "out"), "--extra-context", json.dumps(answers)],
        cwd=tmp_path,
    )
    project = tmp_path / "out" / "digit-lab"
    # The same files as cookiecutter renders (hooks included: the cluster
    # files are pruned), plus cruft's record of the template.
    plain = render(tmp_path / "plain", **answers)
    created = files_and_bytes(project)
    assert json.loads(created.pop(".cruft.json"))["context"]["cookiecutter"]["cluster"] is False
    assert created == files_and_bytes(plain)

    # The user's project, with a commit of their own.
    git("init", "-q", "-b", "main", cwd=project)
    commit_all(project, "rendered")
    model = project / "src" / "digit_lab" / "model.py"
    model.write_text(model.read_text() + "\n# the user's own note\n")
    commit_all(project, "my change")

    # The template moves on.
    default = template / "{{cookiecutter.project_slug}}" / "configs" / "default.yaml"
    default.write_text(default.read_text() + "# a line the template added later\n")
    commit_all(template, "template change")

    check = subprocess.run([str(BIN / "cruft"), "check"], cwd=project, capture_output=True)
    assert check.returncode != 0  # cruft sees the template moved
    run([str(BIN / "cruft"), "update", "--skip-apply-ask", "--allow-untracked-files"], cwd=project)
    assert "# a line the template added later" in (project / "configs" / "default.yaml").read_text()
    assert "# the user's own note" in model.read_text()
    assert not (project / "scripts").exists()  # the prune ran again, harmlessly
    record = json.loads((project / ".cruft.json").read_text())
    assert record["commit"] == git("rev-parse", "HEAD", cwd=template).stdout.strip()


def test_pre_commit_hooks_pass_on_the_rendered_project(tmp_path):
    project = render(tmp_path)
    git("init", "-q", "-b", "main", cwd=project)
    git("add", "-A", cwd=project)
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"),
    }
    result = run([sys.executable, "-m", "pre_commit", "run", "--all-files"], cwd=project, env=env)
    assert "ruff check" in result.stdout and "ruff format" in result.stdout
    assert "Failed" not in result.stdout


@pytest.mark.parametrize("answers", [{}, {"logger": "mlflow", "example": "minimal"}])
def test_declared_bounds_admit_the_versions_the_tests_ran_with(tmp_path, answers):
    project = render(tmp_path, **answers)
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(r) for r in meta["dependencies"]]
    requirements += [Requirement(r) for r in meta["optional-dependencies"]["dev"]]
    for requirement in requirements:
        assert requirement.specifier, f"{requirement.name} has no bounds"
        installed = version(requirement.name)
        assert requirement.specifier.contains(installed, prereleases=True), (
            f"{requirement} excludes the installed {requirement.name} {installed}"
        )


# Releases withdrawn by their maintainers (a supply-chain compromise): no bound may admit them.
WITHDRAWN = {"lightning": ["2.6.2", "2.6.3"], "pytorch-lightning": ["2.6.2", "2.6.3"]}


def test_bounds_exclude_withdrawn_releases(tmp_path):
    project = render(tmp_path)
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    declared = [Requirement(r) for r in meta["dependencies"]]
    declared += [Requirement(line) for line in requirements_dev() if line]
    checked = 0
    for requirement in declared:
        for bad in WITHDRAWN.get(requirement.name, []):
            assert not requirement.specifier.contains(bad, prereleases=True), (requirement, bad)
            checked += 1
    assert checked >= 4  # the rendered project's and the template's own


def requirements_dev() -> list[str]:
    lines = (TEMPLATE / "requirements-dev.txt").read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines]
