# Sourced by demo.sh and test.sh: create (or reuse) the virtual environment at
# $VENV (default .venv) and install what the template and its tests need,
# saying what it installs as it goes.
# torch goes first, pinned, so nothing else pulls a different build:
#   TORCH_SPEC       what to install (default torch==2.13.0)
#   TORCH_INDEX_URL  a wheel index for it, e.g. PyTorch's CPU-only one
VENV="${VENV:-.venv}"

step() { printf '\n==> %s\n' "$*" >&2; }
# pip's own progress, minus the line per package that is already there.
pip_install() {
    python -m pip install --disable-pip-version-check --progress-bar on "$@" 2>&1 |
        while IFS= read -r line; do
            case "$line" in
                "Requirement already satisfied"*) ;;
                *) printf '%s\n' "$line" ;;
            esac
        done
}

if [ ! -x "$VENV/bin/python" ]; then
    step "Creating the virtual environment $VENV"
    "${PYTHON:-python3}" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
torch_args=("${TORCH_SPEC:-torch==2.13.0}")
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    torch_args+=(--index-url "$TORCH_INDEX_URL")
fi
step "Installing ${torch_args[*]} into $VENV (first, so nothing else pulls another build)"
pip_install "${torch_args[@]}"
step "Installing the template's tools and the rendered project's dependencies (requirements-dev.txt)"
pip_install -r requirements-dev.txt
