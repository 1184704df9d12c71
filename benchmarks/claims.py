"""Time what the READMEs and docs promise, on this machine, against their words.

    python benchmarks/claims.py [--slow] [--template] [--output FILE]

Every time the docs promise ("about 10 s on 2 CPU cores") is listed in CLAIMS with
the command it is about; tests/test_claims.py fails on a promise of time that is
not. This renders the defaults into a temporary folder, runs each command there
once, and prints the promise beside the wall time measured. `--slow` adds the
rendered project's whole suite (minutes); `--template` the template's own tests
(about half an hour). Run it on a quiet machine: its figures are this machine's,
and the promises name the machine they hold for.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cookiecutter.main import cookiecutter

TEMPLATE = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
FIT = [PYTHON, "-m", "my_lightning_project", "fit"]
QUICK = [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
ALL = [*QUICK, "--all"]
TEMPLATE_TESTS = ["bash", "scripts/test.sh"]
TEMPLATE_QUICK = [*TEMPLATE_TESTS, "-m", "not slow"]

# (where, the words of the promise, the command it times, which run it needs)
CLAIMS = [
    ("render:README.md", "about 10 s on 2 CPU cores", FIT, "quick"),
    ("render:README.md", "about 60 s on 2 CPU cores", QUICK, "quick"),
    ("render:docs/testing.md", "about 60 s on 2 CPU cores", QUICK, "quick"),
    ("render:docs/testing.md", "about 7 minutes on 2 CPU cores", ALL, "slow"),
    ("render:AGENTS.md", "about 60 s on 2 CPU cores", QUICK, "quick"),
    ("template:README.md", "about 30 minutes on 2 CPU cores", TEMPLATE_TESTS, "template"),
    ("template:README.md", "about 70 s on 2 CPU cores", TEMPLATE_QUICK, "template"),
]


def timed(command: list[str], cwd: Path) -> float:
    template = command[:2] == ["bash", "scripts/test.sh"]
    env = None if template else {**os.environ, "PYTHONPATH": "src"}
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", action="store_true", help="also the rendered whole suite")
    parser.add_argument("--template", action="store_true", help="also the template's tests")
    parser.add_argument("--output", help="write the figures as JSON here")
    args = parser.parse_args()
    runs = {"quick", *(["slow"] if args.slow else []), *(["template"] if args.template else [])}
    rows, seen = [], {}
    with tempfile.TemporaryDirectory() as folder:
        project = Path(cookiecutter(str(TEMPLATE), no_input=True, output_dir=folder))
        for where, words, command, run in CLAIMS:
            if run not in runs:
                continue
            cwd = project if where.startswith("render:") else TEMPLATE
            key = " ".join(command)
            if key not in seen:
                seen[key] = timed(command, cwd)
            rows.append({"where": where, "promise": words, "measured_s": round(seen[key], 1)})
            shown = key.replace(PYTHON, "python")
            print(f"{where:24} {words:32} {shown:48} {seen[key]:7.1f} s")
    if args.output:
        Path(args.output).write_text(json.dumps({"cpus": os.cpu_count(), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
