"""Render the default project and time it against plain PyTorch, on the same work.

    python benchmarks/bench.py [--repeats 3] [--output benchmarks/latest.json]

Same model, data, batch size and number of optimizer steps (the default: 20
epochs of the digits example, validating after each), timed in one process:

  (a) plain   the guide's PyTorch loop done right: .to(device), zero_grad,
              eval() + no_grad for validation
  (b) trainer Lightning's Trainer with its out-of-the-box defaults
  (c) project the rendered project's default `fit` (progress bar, TensorBoard
              logging, best and last checkpoints, environment and health reports)

Each is run `--repeats` times, interleaved; medians are reported, with the
ratios (c)/(a) and (b)/(a). Cold starts are timed too: `fit
--trainer.fast_dev_run true` against `python -c "import lightning.pytorch"`,
and `doctor` against `python -c "import torch"`. On CUDA it adds the project's
fit in fp32 against the resolved precision, samples/s and the data-wait share.
"""

import argparse
import contextlib
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cookiecutter.main import cookiecutter

TEMPLATE = Path(__file__).resolve().parents[1]


def quiet():
    """Send the runs' console output (progress bars, reports) to /dev/null."""
    devnull = open(os.devnull, "w")  # noqa: SIM115 - closed by the ExitStack
    stack = contextlib.ExitStack()
    stack.callback(devnull.close)
    stack.enter_context(contextlib.redirect_stdout(devnull))
    stack.enter_context(contextlib.redirect_stderr(devnull))
    return stack


def plain_loop(pkg, epochs: int, batch_size: int) -> dict:
    import torch
    from torch.utils.data import DataLoader

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(42)
    data = pkg.data.DigitsDataModule(batch_size=batch_size)
    data.setup("fit")
    train = DataLoader(data.splits["train"], batch_size=batch_size, shuffle=True)
    val = DataLoader(data.splits["val"], batch_size=batch_size)
    model = pkg.model.DigitsCNN().to(device)
    optimizer = torch.optim.AdamW(model.parameters())
    loss_fn = torch.nn.CrossEntropyLoss()
    steps, correct = 0, 0
    for _ in range(epochs):
        model.train()
        for x, y in train:
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
    return {"steps": steps, "val_acc": float(correct) / len(data.splits["val"])}


def lightning_defaults(pkg, epochs: int, batch_size: int) -> dict:
    from lightning.pytorch import Trainer, seed_everything

    seed_everything(42)
    trainer = Trainer(max_epochs=epochs)
    trainer.fit(pkg.model.DigitsClassifier(), pkg.data.DigitsDataModule(batch_size=batch_size))
    return {"steps": trainer.global_step, "val_acc": float(trainer.callback_metrics["val/acc"])}


def project_fit(pkg, epochs: int, batch_size: int, *extra: str) -> dict:
    cli = pkg.cli.main(
        ["fit", f"--trainer.max_epochs={epochs}", f"--data.batch_size={batch_size}", *extra]
    )
    health = next(c for c in cli.trainer.callbacks if type(c).__name__ == "TrainingHealth")
    return {
        "steps": cli.trainer.global_step,
        "val_acc": float(cli.trainer.checkpoint_callback.best_model_score),
        "precision": cli.trainer.precision,
        **health.summary,
    }


def timed(fn, *args) -> tuple[float, dict]:
    start = time.perf_counter()
    with quiet():
        result = fn(*args)
    return time.perf_counter() - start, result


def cold_start(cmd: list[str], cwd: Path, env: dict, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True, timeout=600)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=20, help="the project's default is 20")
    parser.add_argument("--batch-size", type=int, default=64, help="the project's default")
    parser.add_argument("--output", type=Path, default=TEMPLATE / "benchmarks" / "latest.json")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-"))
    project = Path(cookiecutter(str(TEMPLATE), no_input=True, output_dir=str(work)))
    sys.path.insert(0, str(project / "src"))
    package = project.name.replace("-", "_")
    modules = {"cli": "kit.cli", "data": "data", "model": "model"}
    pkg = argparse.Namespace(
        **{name: importlib.import_module(f"{package}.{path}") for name, path in modules.items()}
    )
    import torch

    os.chdir(project)  # logs and checkpoints land in the scratch project
    runs = {"plain": [], "trainer": [], "project": []}
    details = {}
    for _ in range(args.repeats):
        for name, fn in (
            ("plain", plain_loop),
            ("trainer", lightning_defaults),
            ("project", project_fit),
        ):
            seconds, result = timed(fn, pkg, args.epochs, args.batch_size)
            runs[name].append(seconds)
            details[name] = result
    medians = {name: statistics.median(times) for name, times in runs.items()}
    steps = {name: details[name]["steps"] for name in runs}
    assert len(set(steps.values())) == 1, f"the runs did different work: {steps}"

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

    report = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        },
        "work": {"epochs": args.epochs, "batch_size": args.batch_size, "steps": steps["plain"]},
        "repeats": args.repeats,
        "seconds": {name: round(s, 3) for name, s in medians.items()},
        "all_seconds": {name: [round(s, 3) for s in times] for name, times in runs.items()},
        "ratio_project_over_plain": round(medians["project"] / medians["plain"], 3),
        "ratio_trainer_over_plain": round(medians["trainer"] / medians["plain"], 3),
        "val_acc": {name: round(details[name]["val_acc"], 4) for name in runs},
        "project_health": {
            k: details["project"].get(k) for k in ("samples_per_s", "data_wait_share")
        },
        "cold_start": {k: round(v, 3) for k, v in cold.items()},
    }
    if torch.cuda.is_available():
        fp32, result = timed(
            project_fit, pkg, args.epochs, args.batch_size, "--trainer.precision=32-true"
        )
        report["cuda"] = {
            "resolved_precision": details["project"]["precision"],
            "project_resolved_s": round(medians["project"], 3),
            "project_fp32_s": round(fp32, 3),
            "fp32_samples_per_s": result.get("samples_per_s"),
            "resolved_samples_per_s": details["project"].get("samples_per_s"),
            "resolved_data_wait_share": details["project"].get("data_wait_share"),
            "peak_memory_mib": details["project"].get("peak_memory_mib"),
        }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
