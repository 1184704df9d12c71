#!/usr/bin/env bash
# Render the template with its defaults into build/demo/, install the project
# and train the example. Extra arguments are answers, e.g. example=minimal.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_env.sh
out="${DEMO_DIR:-build/demo}"
rm -rf "$out"
mkdir -p "$out"
python -m cookiecutter . --no-input --output-dir "$out" "$@"
project=$(find "$out" -mindepth 1 -maxdepth 1 -type d)
cd "$project"
python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
command=$(basename "$project")
echo "+ $command fit   (in $project)"
"$command" fit
