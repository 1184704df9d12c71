"""The rendered project among the tools around it: cruft (an update from the last
release included), pre-commit, each logger's own files, and the dependency bounds it
declares."""

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
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


NOT_THE_TEMPLATE = shutil.ignore_patterns(
    ".git", ".venv", "build", "__pycache__", ".ruff_cache", ".pytest_cache"
)


def template_repository(path: Path) -> Path:
    """A copy of this template as its own git repository, as cruft clones one."""
    shutil.copytree(TEMPLATE, path, ignore=NOT_THE_TEMPLATE)
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

    # The template moves on, its example model too (which the user's project skips).
    default = template / "{{cookiecutter.project_slug}}" / "configs" / "default.yaml"
    default.write_text(default.read_text() + "# a line the template added later\n")
    example = template / "{{cookiecutter.project_slug}}" / "src" / "{{cookiecutter.package_name}}"
    (example / "model.py").write_text(
        "# the example, rewritten\n" + (example / "model.py").read_text()
    )
    commit_all(template, "template change")
    mine = model.read_bytes()

    check = subprocess.run([str(BIN / "cruft"), "check"], cwd=project, capture_output=True)
    assert check.returncode != 0  # cruft sees the template moved
    run([str(BIN / "cruft"), "update", "--skip-apply-ask", "--allow-untracked-files"], cwd=project)
    assert "# a line the template added later" in (project / "configs" / "default.yaml").read_text()
    assert model.read_bytes() == mine  # [tool.cruft] skip: the user's file, as it was
    assert not list(project.rglob("*.rej"))
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
    assert "ty check" in result.stdout  # the types, as CI checks them
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


CHANGELOG = TEMPLATE / "CHANGELOG.md"
# A release: "## 0.1.0 (2026-12-07, commit a4238f3)".
RELEASE = re.compile(r"^## (\d+\.\d+\.\d+) \((\d{4}-\d\d-\d\d), commit ([0-9a-f]{7,40})\)$", re.M)
KIT_INIT = TEMPLATE / "{{cookiecutter.project_slug}}" / "src" / "{{cookiecutter.package_name}}"


def releases_here() -> None:
    """Skip, saying why, where this checkout cannot hold the releases' commits."""
    shallow = subprocess.run(
        ["git", "rev-parse", "--is-shallow-repository"],
        cwd=TEMPLATE,
        capture_output=True,
        text=True,
    )
    if shallow.returncode != 0:
        pytest.skip("the template is not a git checkout here: it holds no release commits")
    if shallow.stdout.strip() == "true":
        pytest.skip("a shallow clone (git clone --depth) holds no earlier release: clone it whole")


def test_the_changelog_names_the_kits_version_and_real_commits():
    text = CHANGELOG.read_text()
    top = re.search(r"^## (\S+)", text, re.M)[1]
    kit = re.search(r'^KIT_VERSION = "(.+)"$', (KIT_INIT / "kit" / "__init__.py").read_text(), re.M)
    assert kit and kit[1] == top  # the kit says which release it is
    releases = RELEASE.findall(text)
    assert releases, "CHANGELOG.md names no release"
    releases_here()
    for release, _, commit in releases:
        exists = ["git", "cat-file", "-e", f"{commit}^{{commit}}"]
        found = subprocess.run(exists, cwd=TEMPLATE)
        assert found.returncode == 0, f"release {release}: no commit {commit} in this repository"


@pytest.mark.slow
def test_a_project_made_from_the_last_release_updates_to_this_checkout(tmp_path):
    """The newest release's project, with a model, data and config of its user's own,
    updated by cruft to this checkout: the kit and its tests become this checkout's, the
    user's files stay theirs, nothing is left to merge by hand, and its tests pass."""
    releases_here()
    release, _, commit = RELEASE.findall(CHANGELOG.read_text())[0]
    template = tmp_path / "template"
    template.mkdir()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit], cwd=TEMPLATE, capture_output=True, check=True
    ).stdout
    tarfile.open(fileobj=io.BytesIO(archive)).extractall(template, filter="data")
    git("init", "-q", "-b", "main", cwd=template)
    commit_all(template, f"release {release}")
    (tmp_path / "out").mkdir()
    cruft = [str(BIN / "cruft"), "create", str(template), "--no-input"]
    run([*cruft, "--output-dir", str(tmp_path / "out")], cwd=tmp_path)
    project = tmp_path / "out" / "my-lightning-project"
    git("init", "-q", "-b", "main", cwd=project)
    commit_all(project, "rendered")
    # The user's own model, data and config; the example's tests gone.
    package = project / "src" / "my_lightning_project"
    for name in ("project.py", "model.py", "data.py"):
        shutil.copy(TEMPLATE / "tests" / "replacements" / "tabular" / name, package / name)
    (project / "tests" / "test_example.py").unlink()
    (project / "configs" / "mine.yaml").write_text("trainer:\n  max_epochs: 3\n")
    commit_all(project, "my model")
    users = [
        "configs/mine.yaml",
        *(f"src/my_lightning_project/{n}" for n in ("project.py", "model.py", "data.py")),
    ]
    before = {name: (project / name).read_bytes() for name in users}

    # The template moves on to this checkout.
    git("rm", "-rq", ".", cwd=template)
    shutil.copytree(TEMPLATE, template, ignore=NOT_THE_TEMPLATE, dirs_exist_ok=True)
    commit_all(template, "this checkout")
    run([str(BIN / "cruft"), "update", "--skip-apply-ask", "--allow-untracked-files"], cwd=project)

    now = render(tmp_path / "now")
    for folder in ("src/my_lightning_project/kit", "tests/kit", "tests/support"):
        theirs = {p.name: p.read_bytes() for p in (now / folder).glob("*.py")}
        ours = {p.name: p.read_bytes() for p in (project / folder).glob("*.py")}
        assert ours == theirs, f"{folder}: not this checkout's"
    assert {name: (project / name).read_bytes() for name in users} == before
    assert not list(project.rglob("*.rej")), "left to merge by hand"
    record = json.loads((project / ".cruft.json").read_text())
    assert record["commit"] == git("rev-parse", "HEAD", cwd=template).stdout.strip()
    # Its tests pass, its model's numbers recorded first (the CHANGELOG says to).
    quick = ["tests/kit/test_numerics.py", "tests/kit/test_cli.py", "tests/kit/test_export.py"]
    pytest_ = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0"]
    result = run(
        [*pytest_, "-m", "not slow", "--record-numerics", *quick], cwd=project, timeout=600
    )
    assert " passed" in result.stdout and " failed" not in result.stdout, result.stdout[-2000:]
