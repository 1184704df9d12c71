"""Remove the files of options that were not chosen, then say what to do next.

Offline and idempotent: it only deletes paths that an option turned off (and
says nothing if they are already gone), so cruft can run it again, in a
temporary copy or in place, without effect.
"""

import shutil
import sys
from pathlib import Path

SLUG = {{ cookiecutter.project_slug | py_string }}
EXAMPLE = {{ cookiecutter.example | py_string }}
OPTIONS = {
    "cluster": {{ cookiecutter.cluster | string | py_string }} == "True",
    "ci": {{ cookiecutter.ci | string | py_string }} == "True",
    "license": {{ cookiecutter.license | py_string }} != "none",
}
# What each option adds; removed when the option is off.
FILES = {
    "cluster": [
        "scripts/torchrun.sh",
        "scripts/slurm.sbatch",
        "scripts/sweep.sbatch",
        "k8s",
        "Dockerfile",
        ".dockerignore",
        "tests/kit/test_cluster.py",
        "docs/cluster.md",
    ],
    "ci": [".github"],
    "license": ["LICENSE"],
}


def prune(root: Path, options: dict[str, bool]) -> list[str]:
    """Delete the files of every option that is off; returns what was deleted."""
    removed = []
    for option, paths in FILES.items():
        if options[option]:
            continue
        for relative in paths:
            path = root / relative
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
            else:
                continue
            removed.append(relative)
    for folder in ("scripts", "k8s"):
        if (root / folder).is_dir() and not any((root / folder).iterdir()):
            (root / folder).rmdir()
    return removed


def next_steps() -> str:
    return f"""
Rendered {SLUG}/ ({EXAMPLE} example). Next:

    cd {SLUG}
    pip install torch          # first, the build for your machine (docs/install.md)
    pip install --require-hashes -r requirements.lock
    pip install --no-deps -e .
    {SLUG} fit
    pytest

or with uv, the torch build named as an extra (cpu, cu126 or cu130):

    uv sync --extra cpu --extra dev
    uv run --extra cpu {SLUG} fit
"""


if __name__ == "__main__":
    prune(Path.cwd(), OPTIONS)
    print(next_steps(), file=sys.stderr)
