"""What a checkpoint save costs the step that asks for it, written in the step and in
the background, on a model of about 100M parameters with AdamW (about 1.2 GB of state).

    python benchmarks/saves.py [--width 4096] [--layers 6] [--steps 24] [--every 4]
                               [--output benchmarks/saves.json]

The default project is rendered and its `project.py` pointed at an MLP of `--layers`
square Linear layers of `--width` (batch 8 of random data, no validation), as a user
plugs in their own. Its `fit` then runs three times, each in a process of its own (so
that each one's peak host memory is its own): saving nothing, then `last.ckpt` every
`--every` optimizer steps with `--checkpoint.async false`, then `true`. A callback
times each step from one batch's start to the next's (a save comes between the two).

Reported for each run: its median step (the saving steps and the first step left
out), its median saving step (the first save left out: it also allocates the host
memory the later ones reuse; it is reported apart), the delay a save adds to its
step (the saving step less the median step of the run that saves nothing), the
ratio of the background's delay to the in-step one's, what the saves cost the run
over all its steps (the sum of every step's time beyond the run that saves nothing,
over the saves: a background write also slows the steps beside it where it competes
for the cores), the kit's own count of the copies and waits, and the peak resident
memory.
"""

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench  # noqa: E402  (the CPU benchmark's rendering, reused)

TEMPLATE = Path(__file__).resolve().parents[1]
NAME = "Save Cost"  # the rendered project whose project.py names the big model
MODEL = """import torch
from lightning.pytorch import LightningModule
from torch import nn
from torch.utils.data import TensorDataset

from save_cost.kit.data import SplitDataModule


class Wide(LightningModule):
    def __init__(self, width: int = 4096, layers: int = 6):
        super().__init__()
        self.net = nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class Noise(SplitDataModule):
    def __init__(self, batch_size: int = 8, batches: int = 24, width: int = 4096):
        super().__init__(batch_size=batch_size)

    def make_splits(self):
        h = self.hparams
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(h.batch_size * (h.batches + 1), h.width, generator=generator)
        y = torch.randn(len(x), h.width, generator=generator)
        n = h.batch_size
        val, train = TensorDataset(x[:n], y[:n]), TensorDataset(x[n:], y[n:])
        return {"train": train, "val": val, "test": val}
"""
PROJECT = """from .kit.spec import Project
from .model import Noise, Wide

PROJECT = Project(model=Wide, datamodule=Noise, monitor="val/loss", mode="min")
TARGET = 10.0
"""


def one_run(project: Path, mode: str, width: int, layers: int, steps: int, every: int):
    """The project's fit in this process, saving every `every` steps in the background
    (`mode` "true"), in the step ("false") or not at all ("none"); each step's
    milliseconds, which steps saved, and this process's peak resident memory."""
    import importlib
    import time

    from lightning.pytorch import Callback

    sys.path.insert(0, str(project / "src"))
    cli = importlib.import_module("save_cost.kit.cli")
    spec = importlib.import_module("save_cost.__main__").project()
    starts, saved_after = [], []

    class Steps(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            starts.append(time.perf_counter())

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if mode != "none" and trainer.global_step % every == 0:  # a save comes next
                saved_after.append(len(starts) - 1)

    os.chdir(project)
    done = cli.main(
        [
            "fit",
            f"--model.width={width}",
            f"--model.layers={layers}",
            f"--data.width={width}",
            f"--data.batches={steps + 1}",  # the last step is timed up to the next batch
            f"--trainer.max_steps={steps + 1}",
            "--trainer.limit_val_batches=0",
            "--trainer.enable_progress_bar=false",
            "--trainer.logger=false",
            f"--checkpoint.dirpath={project / 'checkpoints'}",
            *(() if mode == "none" else (f"--checkpoint.every_n_train_steps={every}",)),
            "--checkpoint.save_top_k=0",
            f"--checkpoint.save_last={mode != 'none'}",
            f"--checkpoint.async={mode == 'true'}",
        ],
        spec,
        callbacks=[Steps()],
    )
    step_ms = [1000 * (b - a) for a, b in zip(starts, starts[1:], strict=False)]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    # The kit's own account (the health report's): what the steps spent copying and waiting.
    writer = importlib.import_module("save_cost.kit.checkpoints").background_writer(done.trainer)
    spent = {}
    if writer is not None:
        spent = {
            "saves": writer.saves,
            "copy_s": writer.copy_seconds,
            "wait_s": writer.wait_seconds,
        }
    return {
        "step_ms": step_ms,
        "saved_after": saved_after,
        "peak_rss_mib": round(peak / 1024),
        **spent,
    }


def summary(run: dict, baseline_ms: float | None = None) -> dict:
    """A run's figures; `baseline_ms`, the median step of the run that saves nothing."""
    steps, saving = run["step_ms"], [i for i in run["saved_after"] if i < len(run["step_ms"])]
    ordinary = [ms for i, ms in enumerate(steps) if i not in saving and i > 0]
    later = [steps[i] for i in saving[1:]]
    median = statistics.median(ordinary)
    baseline = median if baseline_ms is None else baseline_ms
    saving_ms = statistics.median(later) if later else None
    beyond = sum(steps[1:]) - baseline * (len(steps) - 1)
    return {
        "step_ms": round(median, 1),
        "saving_step_ms": saving_ms and round(saving_ms, 1),
        "save_delay_ms": saving_ms and round(saving_ms - baseline, 1),
        "run_cost_per_save_ms": round(beyond / len(saving), 1) if saving else None,
        "first_saving_step_ms": round(steps[saving[0]], 1) if saving else None,
        "saves": len(saving),
        # Background only: the steps' time in the copies, and waiting for a write in flight.
        "copy_ms_per_save": run.get("copy_s") and round(1000 * run["copy_s"] / run["saves"], 1),
        "waited_for_writes_ms": run.get("wait_s") and round(1000 * run["wait_s"], 1),
        "peak_rss_mib": run["peak_rss_mib"],
        "all_step_ms": [round(ms, 1) for ms in steps],
        "saving_steps": saving,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--output", type=Path, default=TEMPLATE / "benchmarks" / "saves.json")
    parser.add_argument("--one-run", nargs=2, metavar=("PROJECT", "ASYNC"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    work = (args.width, args.layers, args.steps, args.every)
    if args.one_run:  # a child: one fit, its figures as JSON on the last line of stdout
        project, mode = Path(args.one_run[0]), args.one_run[1]
        print(json.dumps(one_run(project, mode, *work)))
        return 0
    project = bench.render_with(bench.scratch("saves-"), NAME, MODEL, PROJECT)
    rows, baseline = {}, None
    for name, mode in (
        ("no saves", "none"),
        ("in the step", "false"),
        ("in the background", "true"),
    ):
        child = [sys.executable, __file__, *sys.argv[1:], "--one-run", str(project), mode]
        done = subprocess.run(child, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(done.stderr[-4000:], file=sys.stderr)
            return done.returncode
        rows[name] = summary(json.loads(done.stdout.strip().splitlines()[-1]), baseline)
        baseline = rows["no saves"]["step_ms"]
    import torch

    parameters = args.layers * (args.width * args.width + args.width)
    sync, background = rows["in the step"], rows["in the background"]
    ratio = None
    if sync["save_delay_ms"] and background["save_delay_ms"] is not None:
        ratio = round(background["save_delay_ms"] / sync["save_delay_ms"], 3)
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "work": {
            "parameters": parameters,
            "state_gb": round(3 * 4 * parameters / 1e9, 2),  # weights and AdamW's two moments
            "steps": args.steps,
            "save_every": args.every,
        },
        "rows": rows,
        "ratio_background_delay_over_step_delay": ratio,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{report['device']} | torch {report['torch']} | {report['work']}")
    columns = (
        "step_ms",
        "saving_step_ms",
        "save_delay_ms",
        "run_cost_per_save_ms",
        "first_saving_step_ms",
        "copy_ms_per_save",
        "peak_rss_mib",
    )
    print(f"{'saved':18}" + "".join(f"{c:>21}" for c in columns))
    for name, row in rows.items():
        print(f"{name:18}" + "".join(f"{row[c]!s:>21}" for c in columns))
    print(f"background delay / in-step delay: {ratio}")
    print(f"Wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
