"""A GPU node without internet: `scripts/wheelhouse.py` builds the wheels here, and
they install the template's tool and the rendered project, `dev` extra and all,
with no index, beside the node's own torch. There, with what `[dev]` installs and
nothing else, the kit's tests pass for a problem of the smallest shape."""

import os
import platform
import re
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import yaml
from conftest import TEMPLATE, python, render, run

TINY = Path(__file__).parent / "replacements" / "tiny"  # one batch an epoch in every split


def test_a_stand_in_wheel_is_an_installable_empty_distribution(tmp_path):
    sys.path.insert(0, str(TEMPLATE / "scripts"))
    try:
        from wheelhouse import platforms, stand_in
    finally:
        sys.path.pop(0)
    wheel = stand_in(tmp_path, "torch", "2.11.0")
    assert wheel.name == "torch-2.11.0+wheelhouse-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read("torch-2.11.0+wheelhouse.dist-info/METADATA").decode()
        assert "Name: torch\nVersion: 2.11.0+wheelhouse\n" in metadata
        assert "Requires-Dist" not in metadata
        assert "torch-2.11.0+wheelhouse.dist-info/RECORD" in archive.namelist()
    tags = platforms("x86_64")
    assert tags[0] == "manylinux2014_x86_64" and "manylinux_2_28_x86_64" in tags


@pytest.mark.slow
def test_the_wheelhouse_installs_everything_but_torch_and_the_kit_passes_there(tmp_path):
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    torch_version = torch.__version__.split("+")[0]
    wheels = tmp_path / "wheels"
    scratch = tmp_path / "scratch"  # its render and stand-ins: removed when it ends
    scratch.mkdir()
    python(
        "scripts/wheelhouse.py",
        str(wheels),
        "--python-version",
        here,
        "--machine",
        platform.machine(),
        "--torch",
        torch_version,
        cwd=TEMPLATE,
        TMPDIR=str(scratch),
    )
    assert list(scratch.glob("wheelhouse-*")) == []
    names = {path.name.split("-")[0].lower() for path in wheels.glob("*.whl")}
    assert "torch" not in names and not any(name.startswith("nvidia") for name in names)
    assert {"cookiecutter", "lightning", "jsonargparse", "optuna", "pytest"} <= names

    # A node: a fresh environment with its own torch and nothing else.
    venv = tmp_path / "node"
    python("-m", "venv", str(venv), cwd=tmp_path)
    node = str(venv / "bin" / "python")
    run([node, "-m", "pip", "install", "-q", f"torch=={torch_version}"], cwd=tmp_path)
    # Then everything from the wheels alone: no index, no pip configuration.
    offline = {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}
    project = render(tmp_path / "render")
    install = [node, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    run([*install, "cookiecutter>=2.7,<2.8", "-e", f"{project}[dev]"], cwd=tmp_path, **offline)
    kept = run([node, "-c", "import torch; print(torch.__version__)"], cwd=tmp_path)
    assert kept.stdout.strip() == torch.__version__
    package = project.name.replace("-", "_")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    fit = run([node, "-m", package, "fit", "--trainer.fast_dev_run=true"], cwd=project, env=env)
    assert "Training health" in fit.stderr
    assert Path(node).parent.joinpath("cookiecutter").exists()

    # The kit's tests, in what `[dev]` alone installed, on a problem of the smallest shape
    # (one batch an epoch in every split) with a config of the user's own beside the shipped.
    package_dir = project / "src" / package
    for name in ("project.py", "model.py", "data.py"):
        shutil.copy(TINY / name, package_dir / name)
    (project / "tests" / "test_example.py").unlink()
    mine = yaml.safe_load((project / "configs" / "default.yaml").read_text())
    mine["trainer"]["max_epochs"] = 3
    (project / "configs" / "mine.yaml").write_text(yaml.safe_dump(mine))
    # Every test module imports there (collected), and the quick tests of what needs the
    # extras run: ONNX export and the Optuna sweep (the rest of the kit needs nothing more).
    pytest = [node, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    collected = run([*pytest, "--collect-only", "--all"], cwd=project, env=env)
    assert re.search(r"\d+ tests collected", collected.stdout), collected.stdout[-2000:]
    extras = ["test_export.py", "test_sweep.py"]
    files = [f"tests/kit/{name}" for name in extras]
    suite = run([*pytest, "-m", "not slow", *files], cwd=project, timeout=1200, env=env)
    assert re.search(r"\d+ passed", suite.stdout) and " failed" not in suite.stdout, suite.stdout
