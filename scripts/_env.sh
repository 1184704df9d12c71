# Sourced by demo.sh and test.sh: create (or reuse) the virtual environment at
# $VENV (default .venv) and install what the template and its tests need.
# torch goes first, pinned, so nothing else pulls a different build:
#   TORCH_SPEC       what to install (default torch==2.13.0)
#   TORCH_INDEX_URL  a wheel index for it, e.g. PyTorch's CPU-only one
VENV="${VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
torch_args=("${TORCH_SPEC:-torch==2.13.0}")
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    torch_args+=(--index-url "$TORCH_INDEX_URL")
fi
python -m pip install --quiet --disable-pip-version-check "${torch_args[@]}"
python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
