#!/usr/bin/env bash
# The GPU path, proven in one command on a CUDA machine (a few minutes):
#   1. renders the default project and runs its GPU-marked tests (bf16 fit,
#      parameters and batches on the GPU, peak memory);
#   2. benchmarks it on CUDA: the plain fp32 loop, the project in fp32 and in
#      the resolved precision, eager and compiled, with samples/s, data wait,
#      MFU and peak memory, as a table and a JSON file (GPU_CHECK_OUTPUT, default
#      build/gpu-check/gpu_check.json).
# On a machine without CUDA it says so in one line and exits 1.
# PYTHON names an interpreter that already has torch and the template's tools;
# without it, the .venv of scripts/_env.sh is made and used.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null ||
        { echo "gpu_check: no CUDA device here (torch.cuda.is_available() is False); nothing to check" >&2; exit 1; }
    . scripts/_env.sh
    PYTHON=python
fi
"$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null ||
    { echo "gpu_check: no CUDA device here (torch.cuda.is_available() is False); nothing to check" >&2; exit 1; }
out="${GPU_CHECK_OUTPUT:-build/gpu-check/gpu_check.json}"
work=$(mktemp -d)
"$PYTHON" -m cookiecutter . --no-input --output-dir "$work" >/dev/null
echo "==> GPU tests of the rendered project" >&2
(cd "$work/my-lightning-project" && PYTHONPATH=src "$PYTHON" -m pytest -q -n 0 -m gpu -p no:cacheprovider)
echo "==> Benchmark on CUDA" >&2
"$PYTHON" benchmarks/gpu.py --output "$out"
