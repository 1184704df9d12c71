"""The GPU check's benchmark: the default project on CUDA, in fp32 and the resolved
precision, eager and compiled, against the plain PyTorch loop in fp32.

    python benchmarks/gpu.py [--epochs 5] [--channels 128] [--batch-size 512] [--output FILE]

One row per run: seconds, the median step and its samples/s (the host's clock from
one batch's start to the next, for the loop and the project alike), then the health
report's share of step time spent waiting for data, MFU (model FLOPs utilisation
against the device's peak for the precision in use) and peak memory. Printed as a
table and written as JSON. Needs CUDA.
"""

import argparse
import json
import sys
from pathlib import Path

from cookiecutter.main import cookiecutter

sys.path.insert(0, str(Path(__file__).parent))
import bench  # noqa: E402  (the CPU benchmark's runs, reused)

TEMPLATE = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--channels", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--output", type=Path, default=Path("gpu_check.json"))
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu.py: no CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
        return 1
    work = bench.scratch("gpu-check-")
    project = Path(cookiecutter(str(TEMPLATE), no_input=True, output_dir=str(work)))
    pkg = bench.package_of(project)
    import os

    os.chdir(project)
    work_args = (pkg, args.epochs, args.batch_size, args.channels)
    rows = {}

    def per_step(result: dict) -> dict:
        """The median step (host clock, batch start to batch start) and its samples/s:
        one measure for the plain loop and the project alike."""
        step_ms = result.get("step_ms")
        return {"step_ms": step_ms, "samples_per_s": step_ms and 1000 * args.batch_size / step_ms}

    seconds, result = bench.timed(bench.plain_loop, *work_args)
    rows["plain loop, fp32"] = {"seconds": seconds, **per_step(result)}
    runs = {
        "project, fp32": ["--trainer.precision=32-true"],
        "project, resolved precision": [],
        "project, fp32, compiled": ["--trainer.precision=32-true", "--compile.enabled=true"],
        "project, resolved precision, compiled": ["--compile.enabled=true"],
    }
    for name, flags in runs.items():
        seconds, result = bench.timed(bench.project_fit, *work_args, *flags)
        rows[f"{name} ({result['precision']})" if "resolved" in name else name] = {
            "seconds": seconds,
            **per_step(result),
            "health_samples_per_s": result.get("samples_per_s"),
            **{key: result.get(key) for key in ("data_wait_share", "mfu")},
            "peak_memory_mib": (result.get("peak_memory_mib") or [None])[0],
        }
    report = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "work": {"epochs": args.epochs, "channels": args.channels, "batch_size": args.batch_size},
        "rows": rows,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    columns = ("seconds", "step ms", "samples/s", "data wait", "MFU", "peak MiB")
    header = f"{'run':48} " + " ".join(f"{c:>{max(len(c), 7)}}" for c in columns)
    print(f"{report['device']} | torch {report['torch']} | {report['work']}")
    print(header)
    for name, row in rows.items():
        wait, mfu, peak = row.get("data_wait_share"), row.get("mfu"), row.get("peak_memory_mib")
        cells = (
            f"{row['seconds']:.2f}",
            "" if row["step_ms"] is None else f"{row['step_ms']:.3f}",
            "" if row["samples_per_s"] is None else f"{row['samples_per_s']:.0f}",
            "" if wait is None else f"{100 * wait:.1f}%",
            "" if mfu is None else f"{100 * mfu:.2f}%",
            "" if peak is None else str(peak),
        )
        widths = [max(len(c), 7) for c in columns]
        print(f"{name:48} " + " ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)))
    print(f"Wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
