#!/usr/bin/env bash
# The GPU path, proven in one command on a CUDA machine (a few minutes):
#   1. renders the default project and runs its GPU-marked tests: a fit in the
#      resolved precision with parameters and batches on the GPU, in-memory data
#      sliced there with no copy per batch, no sync between logging steps (CUDA's
#      sync debug mode), MFU and peak memory in the health report;
#   2. benchmarks it on CUDA: the plain fp32 loop, the project in fp32 and in the
#      resolved precision, eager and compiled, with samples/s, data wait, MFU and
#      peak memory, as a table and a JSON file (GPU_CHECK_OUTPUT, default
#      build/gpu-check/gpu_check.json);
#   3. runs the project's `bench` on CUDA (its figures and verdict beside that
#      file, in bench.json);
#   4. one FSDP fit on every GPU (configs/fsdp.yaml: bf16 parameters, fp32
#      reduction), its folder of shards exported to a .pt2;
#   5. what a checkpoint save of a 100M-parameter model with AdamW costs its
#      step on CUDA, written in the step and in the background
#      (benchmarks/saves.py; saves.json beside the other files).
# On a machine without CUDA it says so in one line and exits 1.
#
# Where it gets its packages:
#   PYTHON=<python>   an interpreter with a CUDA build of torch (default: python3);
#   WHEELHOUSE=<dir>  for a node without internet: a folder made elsewhere by
#                     scripts/wheelhouse.py. Everything is installed from it alone
#                     (pip --no-index) into build/gpu-check/venv, which also sees
#                     PYTHON's own packages, so the node's torch is the one used;
#   neither           the template's .venv (scripts/_env.sh), with torch from the index.
set -euo pipefail
cd "$(dirname "$0")/.."
no_cuda() {
    "$1" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null && return 1
    echo "gpu_check: no CUDA device here (torch.cuda.is_available() is False); nothing to check" >&2
    return 0
}
if [ -n "${WHEELHOUSE:-}" ]; then
    base="${PYTHON:-python3}"
    if no_cuda "$base"; then exit 1; fi
    venv="$PWD/build/gpu-check/venv"  # absolute: the tests run from the project
    echo "==> Installing from $WHEELHOUSE alone into $venv (keeping $base's torch)" >&2
    "$base" -m venv "$venv"
    # The venv sees the base interpreter's packages (after its own): torch among them.
    "$base" -c "import site; print('\n'.join(site.getsitepackages()))" \
        >"$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_path('purelib'))")/base.pth"
    PYTHON="$venv/bin/python"
    export PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELHOUSE"
    "$PYTHON" -m pip install -q --disable-pip-version-check "cookiecutter>=2.7,<2.8"
elif [ -z "${PYTHON:-}" ]; then
    if no_cuda python3; then exit 1; fi
    . scripts/_env.sh
    PYTHON=python
fi
if no_cuda "$PYTHON"; then exit 1; fi
out="${GPU_CHECK_OUTPUT:-build/gpu-check/gpu_check.json}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m cookiecutter . --no-input --output-dir "$work" >/dev/null
project="$work/my-lightning-project"
if [ -n "${WHEELHOUSE:-}" ]; then
    "$PYTHON" -m pip install -q --disable-pip-version-check -e "$project[dev]"
fi
echo "==> GPU tests of the rendered project" >&2
(cd "$project" && PYTHONPATH=src "$PYTHON" -m pytest -q -n 0 -m gpu -p no:cacheprovider)
echo "==> Benchmark on CUDA" >&2
"$PYTHON" benchmarks/gpu.py --output "$out"
echo "==> The project's own bench on CUDA: where a step's time goes, and the verdict" >&2
bench_out="$(dirname "$out")/bench.json"
(cd "$project" && PYTHONPATH=src "$PYTHON" -m my_lightning_project bench --json) >"$bench_out"
cat "$bench_out"
echo "==> One FSDP fit on CUDA (configs/fsdp.yaml), exported from its shards" >&2
fsdp_log="$(dirname "$out")/fsdp_fit.log"
(cd "$project" && PYTHONPATH=src "$PYTHON" -m my_lightning_project fit --config configs/fsdp.yaml \
    --trainer.max_epochs 2 --trainer.enable_progress_bar false --trainer.default_root_dir fsdp \
    --trainer.logger.init_args.save_dir fsdp) >"$fsdp_log" 2>&1 || { tail -40 "$fsdp_log"; exit 1; }
grep -E "^(fsdp:|precision:|Training health|Best)" "$fsdp_log" || true
(cd "$project" && PYTHONPATH=src "$PYTHON" -m my_lightning_project export \
    --ckpt_path fsdp/logs/version_0/checkpoints/last.ckpt --output fsdp.pt2)
echo "==> What a checkpoint save costs its step on CUDA, in the step and in the background" >&2
"$PYTHON" benchmarks/saves.py --output "$(dirname "$out")/saves.json"
