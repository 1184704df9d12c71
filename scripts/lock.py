"""Write the rendered project's lock: requirements.lock, with hashes, resolved by uv
with a week's cooldown.

    python scripts/lock.py                      # nothing published in the last 7 days
    python scripts/lock.py --cutoff 2026-11-30  # nothing published after that day

Every render's own `uv pip compile pyproject.toml -o requirements.lock` writes
its lock; the settings it reads ([tool.uv] exclude-newer, [tool.uv.pip]) are in
the template's pyproject.toml. The options that change a project's dependencies
(the example, the logger, the cluster files) are rendered in every combination,
each is resolved, and the locks are merged into one file in Jinja's syntax: a
package's lines that some renders lack are wrapped in a condition on those
options, which the post-render hook evaluates (the file is copied unrendered).
The cutoff is written into pyproject.toml first, so each render resolves with
it and a project re-resolves to the same lock.
"""

import argparse
import datetime
import itertools
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import jinja2
from cookiecutter.main import cookiecutter
from uv import find_uv_bin

TEMPLATE = Path(__file__).resolve().parents[1]
PROJECT = TEMPLATE / "{{cookiecutter.project_slug}}"
LOCK = PROJECT / "requirements.lock"
PYPROJECT = PROJECT / "pyproject.toml"
SLUG = "my-lightning-project"  # the default render's, written back as the template's
COOLDOWN = datetime.timedelta(days=7)
OPTIONS = {
    "example": ["digits", "minimal"],
    "logger": ["tensorboard", "csv", "mlflow", "wandb"],
    "cluster": [True, False],
}
# The key a render's lines are chosen by, in the template's Jinja.
KEY = (
    '{%- set lock = cookiecutter.example ~ "-" ~ cookiecutter.logger'
    ' ~ ("-cluster" if cookiecutter.cluster else "") %}'
)


def key(answers: dict) -> str:
    return f"{answers['example']}-{answers['logger']}" + ("-cluster" if answers["cluster"] else "")


def parse_key(name: str) -> tuple[str, str, bool]:
    example, logger, *cluster = name.split("-")
    return example, logger, bool(cluster)


def set_cutoff(cutoff: datetime.date) -> None:
    """The cutoff, in the template's pyproject.toml."""
    text, found = re.subn(
        r'^exclude-newer = "[^"]*"',
        f'exclude-newer = "{cutoff}T00:00:00Z"',
        PYPROJECT.read_text(),
        flags=re.M,
    )
    if found != 1:
        raise SystemExit(f"{PYPROJECT}: expected one exclude-newer line")
    PYPROJECT.write_text(text)


def resolve(answers: dict, work: Path) -> str:
    """The lock `uv pip compile` writes for one render."""
    project = Path(
        cookiecutter(
            str(TEMPLATE), no_input=True, output_dir=str(work / key(answers)), extra_context=answers
        )
    )
    subprocess.run(
        [find_uv_bin(), "pip", "compile", "pyproject.toml", "-q", "-o", "requirements.lock"],
        cwd=project,
        check=True,
    )
    return (
        (project / "requirements.lock").read_text().replace(SLUG, "{{ cookiecutter.project_slug }}")
    )


def blocks(lock: str) -> tuple[str, list[str], str]:
    """The header, one block per package (its pin, hashes and `via` lines), the footer."""
    body, mark, footer = lock.partition("\n# The following packages")
    header, *rest = re.split(r"^(?=[^\s#])", body, flags=re.M)
    return header, rest, mark + footer  # the footer starts with its blank line


def merge(locks: dict[str, str]) -> str:
    """One template that renders to each lock: shared blocks as they are, the rest
    behind `{% if lock in [...] %}`."""
    ends = {(head, foot) for head, _, foot in map(blocks, locks.values())}
    if len(ends) != 1:
        raise SystemExit(f"the renders' locks start or end differently: {ends}")
    head, foot = ends.pop()
    where: dict[str, list[str]] = {}
    rank: dict[str, tuple[str, int]] = {}  # a package's name, then uv's order of its pins
    for name, text in locks.items():
        seen: dict[str, int] = {}
        for block in blocks(text)[1]:
            package = re.match(r"[^=\s]+", block).group()
            seen[package] = seen.get(package, -1) + 1
            where.setdefault(block, []).append(name)
            rank[block] = min(rank.get(block, (package, seen[package])), (package, seen[package]))
    out = [KEY, head]
    for block in sorted(where, key=lambda b: (rank[b], b)):
        names = where[block]
        out.append(
            block
            if len(names) == len(locks)
            else f"{{% if lock in {sorted(names)} %}}{block}{{% endif %}}"
        )
    out.append(foot)
    template = "".join(out)
    for name, text in locks.items():  # each render gets its own lock back, byte for byte
        rendered = jinja2.Template(template, keep_trailing_newline=True).render(
            cookiecutter=dict(
                zip(OPTIONS, parse_key(name), strict=True),
                project_slug="{{ cookiecutter.project_slug }}",
            )
        )
        if rendered != text:
            raise SystemExit(f"the merged lock does not render to {name}'s")
    return template


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    today = datetime.datetime.now(datetime.UTC).date()
    parser.add_argument(
        "--cutoff",
        type=datetime.date.fromisoformat,
        default=today - COOLDOWN,
        help="take nothing published after this day (default: 7 days ago)",
    )
    args = parser.parse_args(argv)
    if args.cutoff > today - COOLDOWN:
        parser.error(f"--cutoff {args.cutoff} is less than 7 days ago: the cooldown is a week")
    set_cutoff(args.cutoff)
    combos = [
        dict(zip(OPTIONS, values, strict=True)) for values in itertools.product(*OPTIONS.values())
    ]
    with tempfile.TemporaryDirectory(prefix="lock-") as work:
        locks = {key(answers): resolve(answers, Path(work)) for answers in combos}
    LOCK.write_text(merge(locks))
    print(f"{LOCK.relative_to(TEMPLATE)}: {len(combos)} renders, nothing after {args.cutoff}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
