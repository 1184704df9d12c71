"""Render the default project and time it against plain PyTorch and Lightning, on the same work.

    python benchmarks/bench.py [--repeats 5] [--output benchmarks/latest.json]

Same model, data, batch size and number of optimizer steps (the default: 20
epochs of the digits example, validating after each), timed in one process:

  plain            the guide's PyTorch loop done right: .to(device), zero_grad,
                   eval() + no_grad for validation
  lightning_bare   Lightning's loop alone: no logger, checkpoints, progress bar
                   or summary, and no self.log in the training step
  trainer          Lightning's Trainer with its out-of-the-box defaults
  project          the rendered project's default `fit` (progress bar, logging,
                   best and last checkpoints, environment and health reports)
  project_per_sample   the same with `--data.on_device false`: the DataLoader
                   reads the in-memory tensors sample by sample and collates
  project_compiled `--compile.enabled true` (first-step compilation included)

Each is run `--repeats` times, interleaved, after an untimed round of
one-epoch runs (not of the compiled row: its compilation is part of its
figure, and dynamo is reset before each compiled run); medians are reported,
with the ratios to the plain loop and the project's to Lightning's bare loop,
and the same ratios of the fastest runs. Each run's median step is reported
too (from one training batch's start to the next's: the step, every hook, the
logging and the next batch's fetch): a burst of load stretches a few steps but
hardly moves a median over many; when the machine's speed shifts between
rounds, the steps move with it, so compare rows within a round (`all_step_ms`)
as well as the medians. The plain loop, bare Lightning and the Trainer's
defaults read the data sample by sample, as project_per_sample does: that row
against the bare loop is what the project's bells alone cost a step.

Where the project's default fit spends its time above the loop is measured
too: from the call to the start of fit (parsing the config, building the
classes, claiming the run directory, against the bare loop's own building and
setup), and in its checkpoint saves (how many files written, how many copied
from another). A heavier workload (the CNN at 128 channels, a step of tens of
milliseconds on a CPU) repeats plain, bare and project. Cold starts are timed
too: `fit --trainer.fast_dev_run true` against `python -c "import
lightning.pytorch"`, and `doctor` against `python -c "import torch"`. On CUDA
it adds the project's fit in fp32 against the resolved precision, with MFU and
peak memory.

The null workload measures the host's own work a step, which on a GPU is all
a small model's step is: a second project is rendered and its `project.py`
pointed at a near-null model (`nn.Linear(16, 1)`, batch 16, in-memory data),
as a user plugs in their own. Plain loop, bare Lightning, Lightning's
`Trainer()` defaults and the project's `fit` (also without its progress bar,
without its logger, and without both: what each bell costs) each run it for a
short and a long number of steps (`--null-steps`), interleaved over the
repeats; the difference over the extra steps is each row's marginal cost a
step in microseconds, with every fixed cost (building, setup, validation, the
last checkpoint) dropped out.
"""

import argparse
import atexit
import contextlib
import importlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cookiecutter.main import cookiecutter

TEMPLATE = Path(__file__).resolve().parents[1]
HEAVY_CHANNELS = 128
NULL_NAME = "Null Step"  # the second project, whose project.py names the near-null model
NULL_FEATURES, NULL_BATCH = 16, 16
# model.py of the null project, as a user writes theirs.
NULL_MODEL = """import torch
from lightning.pytorch import LightningModule
from torch import nn
from torch.utils.data import TensorDataset

from null_step.kit.data import SplitDataModule


class NullModel(LightningModule):
    def __init__(self, features: int = 16):
        super().__init__()
        self.net = nn.Linear(features, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class NullData(SplitDataModule):
    def __init__(self, batch_size: int = 16, batches: int = 100, features: int = 16):
        super().__init__(batch_size=batch_size)

    def make_splits(self):
        h = self.hparams
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(h.batch_size * (h.batches + 2), h.features, generator=generator)
        y = torch.randn(len(x), 1, generator=generator)
        val = 2 * h.batch_size
        test = TensorDataset(x[:val], y[:val])
        return {"train": TensorDataset(x[val:], y[val:]), "val": test, "test": test}
"""
NULL_PROJECT = """from .kit.spec import Project
from .model import NullData, NullModel

PROJECT = Project(model=NullModel, datamodule=NullData, monitor="val/loss", mode="min")
TARGET = 10.0
"""


def quiet():
    """Send the runs' console output (progress bars, reports) to /dev/null."""
    devnull = open(os.devnull, "w")  # noqa: SIM115 - closed by the ExitStack
    stack = contextlib.ExitStack()
    stack.callback(devnull.close)
    stack.enter_context(contextlib.redirect_stdout(devnull))
    stack.enter_context(contextlib.redirect_stderr(devnull))
    return stack


def plain_loop(pkg, epochs: int, batch_size: int, channels: int) -> dict:
    import torch
    from torch.utils.data import DataLoader

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(42)
    data = pkg.data.DigitsDataModule(batch_size=batch_size, on_device=False)
    data.setup("fit")
    # Whole batches, as the project's training order trains whole optimizer steps.
    train = DataLoader(data.splits["train"], batch_size=batch_size, shuffle=True, drop_last=True)
    val = DataLoader(data.splits["val"], batch_size=batch_size)
    model = pkg.model.DigitsCNN(channels=channels).to(device)
    optimizer = torch.optim.AdamW(model.parameters())
    loss_fn = torch.nn.CrossEntropyLoss()
    steps, correct, cycles = 0, 0, []
    for _ in range(epochs):
        model.train()
        last = None
        for x, y in train:
            now = time.perf_counter()  # where Lightning calls on_train_batch_start
            if last is not None:
                cycles.append(now - last)
            last = now
            x, y = x.to(device), y.to(device)
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in val:
                x, y = x.to(device), y.to(device)
                correct += (model(x).argmax(1) == y).sum()
    return {
        "steps": steps,
        "val_acc": float(correct) / len(data.splits["val"]),
        **steps_timed(cycles),
    }


def steps_timed(cycles: list[float]) -> dict:
    """The median step in ms (None when no epoch had two batches) and how many were timed."""
    return {"step_ms": 1000 * statistics.median(cycles) if cycles else None, "cycles": len(cycles)}


def fit_start():
    """A callback that notes when fit starts (after setup: data, model, logger),
    and the time from each training batch's start to the next's in an epoch:
    one whole step, with every hook, the logging and the next batch's fetch."""
    from lightning.pytorch import Callback

    class FitStart(Callback):
        def on_fit_start(self, trainer, pl_module):
            self.at = time.perf_counter()
            self.cycles = []

        def on_train_epoch_start(self, trainer, pl_module):
            self.last = None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            now = time.perf_counter()
            if self.last is not None:
                self.cycles.append(now - self.last)
            self.last = now

    return FitStart()


def lightning_fit(pkg, epochs: int, batch_size: int, channels: int, bare: bool) -> dict:
    from lightning.pytorch import Trainer, seed_everything

    started, mark = time.perf_counter(), fit_start()
    seed_everything(42)
    if bare:
        trainer = Trainer(
            max_epochs=epochs,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[mark],
        )
    else:
        trainer = Trainer(max_epochs=epochs, callbacks=[mark])
    model = pkg.model.DigitsClassifier(channels=channels)
    trainer.fit(model, pkg.data.DigitsDataModule(batch_size=batch_size, on_device=False))
    return {
        "steps": trainer.global_step,
        "val_acc": float(trainer.callback_metrics["val/acc"]),
        "before_fit_s": mark.at - started,
        **steps_timed(mark.cycles),
    }


def lightning_bare(pkg, epochs, batch_size, channels) -> dict:
    return lightning_fit(pkg, epochs, batch_size, channels, bare=True)


def lightning_defaults(pkg, epochs, batch_size, channels) -> dict:
    return lightning_fit(pkg, epochs, batch_size, channels, bare=False)


SAVES = {"seconds": 0.0, "written": 0, "copied": 0}  # the checkpoint saves of one fit


def count_saves(checkpoints) -> None:
    """Time the checkpoint callback's saves and count files written and copied."""
    save, write, copy = (
        checkpoints.BestAndLast._save_checkpoint,
        checkpoints.atomic_save,
        checkpoints.atomic_copy,
    )

    def timed_save(self, trainer, filepath):
        start = time.perf_counter()
        try:
            return save(self, trainer, filepath)
        finally:
            SAVES["seconds"] += time.perf_counter() - start

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            SAVES[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    checkpoints.BestAndLast._save_checkpoint = timed_save
    checkpoints.atomic_save = counted("written", write)
    checkpoints.atomic_copy = counted("copied", copy)


def project_fit(pkg, epochs: int, batch_size: int, channels: int, *extra: str) -> dict:
    SAVES.update(seconds=0.0, written=0, copied=0)
    started, mark = time.perf_counter(), fit_start()
    cli = pkg.cli.main(
        [
            "fit",
            f"--trainer.max_epochs={epochs}",
            f"--data.batch_size={batch_size}",
            f"--model.channels={channels}",
            *extra,
        ],
        pkg.project,
        # The bar a terminal shows (this run's output goes nowhere, where the kit would
        # print a line an epoch instead), unless the row leaves it out.
        callbacks=[mark, *([] if NO_BAR in extra else [pkg.console.TQDMBar()])],
    )
    health = pkg.callbacks.find_callback(cli.trainer, pkg.health.TrainingHealth)
    return {
        "steps": cli.trainer.global_step,
        "val_acc": float(cli.trainer.checkpoint_callback.best_model_score),
        "precision": cli.trainer.precision,
        "before_fit_s": mark.at - started,
        **steps_timed(mark.cycles),
        "checkpoint_s": SAVES["seconds"],
        "checkpoints_written": SAVES["written"],
        "checkpoints_copied": SAVES["copied"],
        **health.summary,
    }


def project_per_sample(pkg, epochs, batch_size, channels) -> dict:
    return project_fit(pkg, epochs, batch_size, channels, "--data.on_device=false")


def project_compiled(pkg, epochs, batch_size, channels) -> dict:
    import torch

    torch._dynamo.reset()  # each run compiles, as a new process would (inductor's disk cache kept)
    return project_fit(pkg, epochs, batch_size, channels, "--compile.enabled=true")


def package_of(project: Path) -> argparse.Namespace:
    """The rendered `project`'s modules the benchmarks use, imported."""
    sys.path.insert(0, str(project / "src"))
    package = project.name.replace("-", "_")
    modules = {
        "cli": "kit.cli",
        "callbacks": "kit.callbacks",
        "checkpoints": "kit.checkpoints",
        "console": "kit.console",
        "health": "kit.health",
        "data": "data",
        "model": "model",
        "main": "__main__",
    }
    found = {name: importlib.import_module(f"{package}.{path}") for name, path in modules.items()}
    return argparse.Namespace(**found, project=found["main"].project())


def scratch(prefix: str) -> Path:
    """A new folder for a benchmark's projects, checkpoints and logs, removed when the
    process exits (a save benchmark writes gigabytes)."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    return work


def render_with(work: Path, name: str, model: str, project_py: str) -> Path:
    """The default project rendered as `name` into `work`, its `model.py` and `project.py`
    replaced by the given texts, as a user plugs in their own model; its root."""
    project = Path(
        cookiecutter(
            str(TEMPLATE), no_input=True, output_dir=str(work), extra_context={"project_name": name}
        )
    )
    package = project / "src" / project.name.replace("-", "_")
    (package / "model.py").write_text(model)
    (package / "project.py").write_text(project_py)
    return project


def null_package(work: Path) -> argparse.Namespace:
    """The null project: rendered, its model.py and project.py replaced, imported."""
    project = render_with(work, NULL_NAME, NULL_MODEL, NULL_PROJECT)
    sys.path.insert(0, str(project / "src"))
    return argparse.Namespace(
        root=project,
        cli=importlib.import_module("null_step.kit.cli"),
        model=importlib.import_module("null_step.model"),
        project=importlib.import_module("null_step.__main__").project(),
    )


def null_plain(null, steps: int) -> None:
    import torch

    torch.manual_seed(0)
    data = null.model.NullData(batches=steps)
    data.setup("fit")
    model = null.model.NullModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in data.train_dataloader():
        loss = torch.nn.functional.mse_loss(model.net(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def null_lightning(null, steps: int, bare: bool) -> None:
    from lightning.pytorch import Trainer, seed_everything

    seed_everything(0)
    off = dict(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer = Trainer(max_steps=steps, limit_val_batches=2, **(off if bare else {}))
    trainer.fit(null.model.NullModel(), null.model.NullData(batches=steps))


def null_project(null, steps: int, *flags: str) -> None:
    null.cli.main(
        [
            "fit",
            f"--trainer.max_steps={steps}",
            "--trainer.limit_val_batches=2",
            f"--data.batches={steps}",
            *flags,
        ],
        null.project,
    )


NO_BAR, NO_LOGGER = "--trainer.enable_progress_bar=false", "--trainer.logger=false"
NULL_ROWS = {
    "plain": null_plain,
    "lightning_bare": lambda null, steps: null_lightning(null, steps, bare=True),
    "trainer": lambda null, steps: null_lightning(null, steps, bare=False),
    "project": null_project,
    # What each bell costs: the project without it.
    "project_no_bar": lambda null, steps: null_project(null, steps, NO_BAR),
    "project_no_logger": lambda null, steps: null_project(null, steps, NO_LOGGER),
    "project_no_bar_no_logger": lambda null, steps: null_project(null, steps, NO_BAR, NO_LOGGER),
}


def null_workload(null, repeats: int, steps: int) -> dict:
    """Each row's marginal host cost a step, in microseconds: the time of a run of
    `steps` steps less one of `steps // 5`, over the extra steps; medians over `repeats`."""
    short = max(2, steps // 5)
    previous = Path.cwd()
    os.chdir(null.root)  # its runs' logs and checkpoints land in its own folder
    try:
        with quiet():
            for fn in NULL_ROWS.values():  # warm-up: first runs in a process pay for caches
                fn(null, short)
        every = {name: [] for name in NULL_ROWS}
        for _ in range(repeats):
            for name, fn in NULL_ROWS.items():
                times = []
                for n in (short, steps):
                    start = time.perf_counter()
                    with quiet():
                        fn(null, n)
                    times.append(time.perf_counter() - start)
                every[name].append(1e6 * (times[1] - times[0]) / (steps - short))
    finally:
        os.chdir(previous)
    step_us = {name: round(statistics.median(us), 1) for name, us in every.items()}
    return {
        "model": f"nn.Linear({NULL_FEATURES}, 1), batch {NULL_BATCH}, data in memory",
        "steps": [short, steps],
        "step_us": step_us,
        "all_step_us": {name: [round(us, 1) for us in every[name]] for name in every},
        "ratio_project_over_lightning_bare": round(
            step_us["project"] / step_us["lightning_bare"], 3
        ),
        "ratio_project_over_trainer": round(step_us["project"] / step_us["trainer"], 3),
        "ratio_lightning_bare_over_plain": round(step_us["lightning_bare"] / step_us["plain"], 3),
        # Each bell's cost a step: the project with it less the project without it.
        "bells_us": {
            "checkpoints_and_kit_callbacks": round(
                step_us["project_no_bar_no_logger"] - step_us["lightning_bare"], 1
            ),
            "progress_bar": round(step_us["project"] - step_us["project_no_bar"], 1),
            "logger": round(step_us["project"] - step_us["project_no_logger"], 1),
        },
    }


def timed(fn, *args) -> tuple[float, dict]:
    start = time.perf_counter()
    with quiet():
        result = fn(*args)
    return time.perf_counter() - start, result


# Rows whose first-run cost is their point: left out of the warm-up round.
COLD = {"project_compiled"}


def interleaved(runs: dict, repeats: int, warmup: int, *args) -> tuple[dict, dict, dict]:
    """Seconds of each run over `repeats` rounds, each one's last result, and all its results.

    A round of `warmup`-epoch runs comes first, untimed: the first runs in a
    process pay for warming caches and allocators, which is no row's own cost."""
    pkg, _, *rest = args
    with quiet():
        for name, fn in runs.items() if warmup else ():
            if name not in COLD:
                fn(pkg, warmup, *rest)
    seconds = {name: [] for name in runs}
    details, every = {}, {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            elapsed, details[name] = timed(fn, *args)
            seconds[name].append(elapsed)
            every[name].append(details[name])
    steps = {name: details[name]["steps"] for name in runs}
    assert len(set(steps.values())) == 1, f"the runs did different work: {steps}"
    return seconds, details, every


def step_ms(every: dict) -> dict:
    """Each run's median step (its steady cost, which a burst of load on a shared
    machine hardly moves), the median of those over the repeats."""
    medians = {}
    for name, results in every.items():
        timed = [r["step_ms"] for r in results if r["step_ms"] is not None]
        medians[name] = round(statistics.median(timed), 2) if timed else None
    return medians


def all_step_ms(every: dict) -> dict:
    return {
        name: [None if r["step_ms"] is None else round(r["step_ms"], 2) for r in results]
        for name, results in every.items()
    }


def breakdown(results: list[dict], bare: list[dict]) -> dict:
    """Medians of where the project's fits spent their time above the loop (and
    the bare loop's own time to the start of fit: building, data and model setup)."""
    return {
        "before_fit_s": round(statistics.median(r["before_fit_s"] for r in results), 3),
        "lightning_bare_before_fit_s": round(statistics.median(r["before_fit_s"] for r in bare), 3),
        "checkpoint_s": round(statistics.median(r["checkpoint_s"] for r in results), 3),
        "checkpoints_written": results[-1]["checkpoints_written"],
        "checkpoints_copied": results[-1]["checkpoints_copied"],
    }


def cold_start(cmd: list[str], cwd: Path, env: dict, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True, timeout=600)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=20, help="the project's default is 20")
    parser.add_argument("--heavy-epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64, help="the project's default")
    parser.add_argument("--warmup-epochs", type=int, default=1, help="0: no warm-up round")
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled row")
    parser.add_argument(
        "--null-steps", type=int, default=1100, help="the null workload's long run, in steps"
    )
    parser.add_argument("--output", type=Path, default=TEMPLATE / "benchmarks" / "latest.json")
    args = parser.parse_args()

    work = scratch("bench-")
    project = Path(cookiecutter(str(TEMPLATE), no_input=True, output_dir=str(work)))
    pkg = package_of(project)
    import torch

    count_saves(pkg.checkpoints)
    package = project.name.replace("-", "_")
    null = null_package(work)
    os.chdir(project)  # logs and checkpoints land in the scratch project
    runs = {
        "plain": plain_loop,
        "lightning_bare": lightning_bare,
        "trainer": lightning_defaults,
        "project": project_fit,
        "project_per_sample": project_per_sample,
    }
    if not args.no_compile:
        runs["project_compiled"] = project_compiled
    seconds, details, every = interleaved(
        runs, args.repeats, args.warmup_epochs, pkg, args.epochs, args.batch_size, 32
    )
    medians = {name: statistics.median(times) for name, times in seconds.items()}
    heavy_runs = {"plain": plain_loop, "lightning_bare": lightning_bare, "project": project_fit}
    heavy_seconds, heavy_details, heavy_every = interleaved(
        heavy_runs,
        args.repeats,
        args.warmup_epochs,
        pkg,
        args.heavy_epochs,
        args.batch_size,
        HEAVY_CHANNELS,
    )
    heavy = {name: statistics.median(times) for name, times in heavy_seconds.items()}

    null_report = null_workload(null, args.repeats, args.null_steps)

    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    python = sys.executable
    cold = {
        "import_lightning_s": cold_start(
            [python, "-c", "import lightning.pytorch"], project, env, args.repeats
        ),
        "fast_dev_run_s": cold_start(
            [python, "-m", package, "fit", "--trainer.fast_dev_run=true"],
            project,
            env,
            args.repeats,
        ),
        "import_torch_s": cold_start([python, "-c", "import torch"], project, env, args.repeats),
        "doctor_s": cold_start([python, "-m", package, "doctor"], project, env, args.repeats),
    }
    cold["fast_dev_run_over_import_s"] = cold["fast_dev_run_s"] - cold["import_lightning_s"]
    cold["doctor_over_import_torch_s"] = cold["doctor_s"] - cold["import_torch_s"]

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round(a / b, 3)

    steps, heavy_steps = step_ms(every), step_ms(heavy_every)
    report = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        },
        "work": {
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "steps": details["plain"]["steps"],
        },
        "repeats": args.repeats,
        "warmup_epochs": args.warmup_epochs,
        "seconds": {name: round(s, 3) for name, s in medians.items()},
        "all_seconds": {name: [round(s, 3) for s in times] for name, times in seconds.items()},
        # The fastest of the interleaved runs: the one the machine disturbed least.
        "fastest_seconds": {name: round(min(times), 3) for name, times in seconds.items()},
        "fastest_ratios": {
            "project_over_plain": ratio(min(seconds["project"]), min(seconds["plain"])),
            "project_over_lightning_bare": ratio(
                min(seconds["project"]), min(seconds["lightning_bare"])
            ),
            "trainer_over_plain": ratio(min(seconds["trainer"]), min(seconds["plain"])),
            "heavy_project_over_plain": ratio(
                min(heavy_seconds["project"]), min(heavy_seconds["plain"])
            ),
            "heavy_project_over_lightning_bare": ratio(
                min(heavy_seconds["project"]), min(heavy_seconds["lightning_bare"])
            ),
        },
        "ratio_project_over_plain": ratio(medians["project"], medians["plain"]),
        "ratio_trainer_over_plain": ratio(medians["trainer"], medians["plain"]),
        "ratio_project_over_lightning_bare": ratio(medians["project"], medians["lightning_bare"]),
        "ratio_per_sample_over_sliced": ratio(medians["project_per_sample"], medians["project"]),
        "ratio_compiled_over_eager": (
            ratio(medians["project_compiled"], medians["project"]) if not args.no_compile else None
        ),
        "step_ms": steps,
        "all_step_ms": all_step_ms(every),
        "step_cycles": {name: details[name]["cycles"] for name in runs},
        "ratio_step_project_over_lightning_bare": ratio(steps["project"], steps["lightning_bare"]),
        # The same data path as the bare loop's: what the bells alone cost a step.
        "ratio_step_per_sample_over_lightning_bare": ratio(
            steps["project_per_sample"], steps["lightning_bare"]
        ),
        "ratio_step_project_over_plain": ratio(steps["project"], steps["plain"]),
        "val_acc": {name: round(details[name]["val_acc"], 4) for name in runs},
        "project_breakdown": breakdown(every["project"], every["lightning_bare"]),
        "project_health": {
            k: details["project"].get(k)
            for k in ("samples_per_s", "data_wait_share", "flops_per_batch", "flops_per_s", "mfu")
        },
        "heavy": {
            "channels": HEAVY_CHANNELS,
            "epochs": args.heavy_epochs,
            "steps": heavy_details["plain"]["steps"],
            "seconds": {name: round(s, 3) for name, s in heavy.items()},
            "all_seconds": {
                name: [round(s, 3) for s in times] for name, times in heavy_seconds.items()
            },
            "ms_per_step_plain": round(1000 * heavy["plain"] / heavy_details["plain"]["steps"], 1),
            "ratio_project_over_plain": ratio(heavy["project"], heavy["plain"]),
            "ratio_project_over_lightning_bare": ratio(heavy["project"], heavy["lightning_bare"]),
            "step_ms": heavy_steps,
            "all_step_ms": all_step_ms(heavy_every),
            "ratio_step_project_over_plain": ratio(heavy_steps["project"], heavy_steps["plain"]),
            "ratio_step_project_over_lightning_bare": ratio(
                heavy_steps["project"], heavy_steps["lightning_bare"]
            ),
            "project_breakdown": breakdown(heavy_every["project"], heavy_every["lightning_bare"]),
        },
        "cold_start": {k: round(v, 3) for k, v in cold.items()},
        "null": null_report,
    }
    if torch.cuda.is_available():
        fp32, result = timed(
            project_fit, pkg, args.epochs, args.batch_size, 32, "--trainer.precision=32-true"
        )
        report["cuda"] = {
            "resolved_precision": details["project"]["precision"],
            "project_resolved_s": round(medians["project"], 3),
            "project_fp32_s": round(fp32, 3),
            "fp32_samples_per_s": result.get("samples_per_s"),
            "resolved_samples_per_s": details["project"].get("samples_per_s"),
            "resolved_data_wait_share": details["project"].get("data_wait_share"),
            "resolved_mfu": details["project"].get("mfu"),
            "peak_memory_mib": details["project"].get("peak_memory_mib"),
        }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
