#!/usr/bin/env bash
# Render the template with its defaults into build/demo/, install the project
# and train the example. Extra arguments are answers, e.g. example=minimal.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_env.sh
out="${DEMO_DIR:-build/demo}"
rm -rf "$out"
mkdir -p "$out"
step "Rendering the template into $out/"
python -m cookiecutter . --no-input --output-dir "$out" "$@"
project=$(find "$out" -mindepth 1 -maxdepth 1 -type d)
cd "$project"
step "Installing the rendered project into $VENV: pip install -e \".[dev]\""
pip_install -e ".[dev]"
command=$(basename "$project")
step "Training the example: $command fit   (in $project)"
"$command" fit
