#!/usr/bin/env bash
# The template's tests, all of them: render every supported combination, lint
# it, run each rendered project's own suite, install one. GPU tests skip
# without CUDA. Extra arguments go to pytest (e.g. -m "not slow").
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_env.sh
python -m ruff check .
python -m ruff format --check .
# pytest exits 5 when it collected nothing: set -e makes that a failure too.
# The slowest tests are listed at the end: where the time budget goes.
python -m pytest --durations=25 "$@"
