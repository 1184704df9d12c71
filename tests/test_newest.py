"""Whether the rendered project holds on the newest releases a user's `pip install` gets:
torch (a bare `pip install torch`, whose build and release differ from the one pinned
here), Lightning and jsonargparse (past the project's own bounds, to learn whether they
can rise). In an environment of their own, the kit's quick tests, those of its private
names first, then `ty check`, which pre-commit and the project's CI run. (Where those
are the versions installed here, the other tests already ran the kit on them.)"""

import os
import site
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from conftest import render, run

NEWEST = ("torch", "lightning", "jsonargparse")


@pytest.mark.slow
@pytest.mark.newest
def test_the_kit_on_the_newest_releases(tmp_path):
    project = render(tmp_path / "render")
    venv = tmp_path / "venv"
    # This environment's packages (the test tools) behind the venv's own, where the
    # newest releases go.
    run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    python = str(venv / "bin" / "python")
    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    own = run([python, "-c", where], cwd=tmp_path)
    (Path(own.stdout.strip()) / "beside.pth").write_text("\n".join(site.getsitepackages()))
    # Not quiet: a download of gigabytes says it is still going.
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check"]
    run([*pip, "--upgrade", "torch", "lightning", "jsonargparse[signatures]"], cwd=tmp_path)
    run([*pip, "--no-deps", "-e", str(project)], cwd=tmp_path)
    report = f"from importlib.metadata import version; print(*map(version, {NEWEST!r}))"
    newest = run([python, "-c", report], cwd=tmp_path).stdout.split()
    releases = ", ".join(f"{name} {v}" for name, v in zip(NEWEST, newest, strict=True))
    if newest == [version(name) for name in NEWEST]:  # the other tests ran the kit on these
        print(f"{releases}: the newest, tested here")
        return
    # The test tools' commands (hadolint, ruff) from this environment, after the venv's.
    here = str(Path(sys.executable).parent)
    path = os.pathsep.join([str(venv / "bin"), here, os.environ["PATH"]])
    quick = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-m", "not slow"]
    first = run([*quick, "tests/kit/test_internals.py"], cwd=project, PATH=path)
    assert " passed" in first.stdout, first.stdout[-2000:]
    rest = [*quick, "--deselect", "tests/kit/test_internals.py"]
    result = run(rest, cwd=project, PATH=path)
    assert " failed" not in result.stdout, result.stdout[-3000:]
    run([python, "-m", "ty", "check", "--python", python], cwd=project, PATH=path)
    print(f"{releases}: the kit's quick tests and ty check pass")
