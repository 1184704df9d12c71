"""Remove the files of options that were not chosen, keep the lock of the chosen
ones, then say what to do next.

Offline and idempotent: it only deletes paths that an option turned off (and
says nothing if they are already gone), and a lock already chosen has nothing
left to choose, so cruft can run it again, in a temporary copy or in place,
without effect.
"""

import ast
import re
import shutil
import sys
from pathlib import Path

SLUG = {{ cookiecutter.project_slug | py_string }}
EXAMPLE = {{ cookiecutter.example | py_string }}
LOGGER = {{ cookiecutter.logger | py_string }}
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


{% raw %}
def choose_lock(path: Path, key: str, slug: str) -> None:
    """requirements.lock as this render's own: scripts/lock.py keeps the locks of every
    combination of options in one file, a package's lines that some lack behind
    `{% if lock in [...] %}` (copied unrendered: as a template, its size would slow
    every render)."""
    text = re.sub(r"\{%-? set lock = .*?%\}", "", path.read_text(), count=1)

    def chosen(block: re.Match) -> str:
        return block.group(2) if key in ast.literal_eval(block.group(1)) else ""

    text = re.sub(r"\{% if lock in (\[.*?\]) %\}(.*?)\{% endif %\}", chosen, text, flags=re.S)
    path.write_text(text.replace("{{ cookiecutter.project_slug }}", slug))
{% endraw %}

def next_steps() -> str:
    """The README's Start block (its torch line for a machine without an NVIDIA GPU), then
    uv's way."""
    return f"""
Rendered {SLUG}/ ({EXAMPLE} example). Next, as its README's Start says:

    cd {SLUG}
    python -m venv .venv && source .venv/bin/activate
    pip install torch --index-url https://download.pytorch.org/whl/cpu  # torch first: no NVIDIA GPU
    pip install --require-hashes -r requirements.lock   # the rest, as locked (test tools too)
    pip install --no-deps -e .                          # the project itself
    {SLUG} fit
    pytest

With an NVIDIA GPU, torch's line names its CUDA (docs/install.md). Or with uv, the torch
build named as an extra (cpu, cu126 or cu130):

    cd {SLUG}
    uv sync --extra cpu --extra dev
    uv run --extra cpu {SLUG} fit
"""


if __name__ == "__main__":
    prune(Path.cwd(), OPTIONS)
    lock = f"{EXAMPLE}-{LOGGER}" + ("-cluster" if OPTIONS["cluster"] else "")
    choose_lock(Path.cwd() / "requirements.lock", lock, SLUG)
    print(next_steps(), file=sys.stderr)
