"""Whether the rendered project's upper bound on Lightning can rise: its kit's quick
tests, those of Lightning's private names first, on the newest Lightning and
jsonargparse the index offers, installed past the project's own bounds. (Where those
are the versions installed here, the other tests already ran the kit on them.)"""

import site
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from conftest import render, run


@pytest.mark.slow
@pytest.mark.newest
def test_the_kit_on_the_newest_lightning(tmp_path):
    project = render(tmp_path / "render")
    venv = tmp_path / "venv"
    # This environment's packages (torch, the test tools) behind the venv's own, where
    # the newest Lightning goes.
    run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    python = str(venv / "bin" / "python")
    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    own = run([python, "-c", where], cwd=tmp_path)
    (Path(own.stdout.strip()) / "beside.pth").write_text("\n".join(site.getsitepackages()))
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    run([*pip, "--upgrade", "lightning", "jsonargparse[signatures]"], cwd=tmp_path)
    run([*pip, "--no-deps", "-e", str(project)], cwd=tmp_path)
    versions = run(
        [
            python,
            "-c",
            "import lightning, jsonargparse; print(lightning.__version__,"
            " jsonargparse.__version__)",
        ],
        cwd=tmp_path,
    ).stdout.split()
    tested = [version("lightning"), version("jsonargparse")]
    if versions == tested:  # the other tests ran the kit on these already: nothing to learn
        print(f"lightning {versions[0]}, jsonargparse {versions[1]}: the newest, tested here")
        return
    quick = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-m", "not slow"]
    first = run([*quick, "tests/kit/test_internals.py"], cwd=project, timeout=600)
    assert " passed" in first.stdout, first.stdout[-2000:]
    rest = run([*quick, "--deselect", "tests/kit/test_internals.py"], cwd=project, timeout=1200)
    assert " failed" not in rest.stdout, rest.stdout[-3000:]
    print(f"lightning {versions[0]}, jsonargparse {versions[1]}: the kit's quick tests pass")
