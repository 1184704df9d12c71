"""Reading what a run left: its directories, logged scalars and checkpoints."""

from pathlib import Path

import torch

{%- if cookiecutter.logger in ("tensorboard", "csv") %}


def run_dirs(root: Path) -> list[Path]:
    """The run directories under `root`, oldest first."""
    runs = (root / "logs").glob("version_*")
    return sorted(runs, key=lambda run: int(run.name.removeprefix("version_")))
{%- endif %}
{%- if cookiecutter.logger == "tensorboard" %}


def logged_scalars(run: Path) -> dict[str, list[float]]:
    """Every scalar the run logged, by name, in logging order (TensorBoard event files)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logged: dict[str, list[float]] = {}
    for events_file in sorted(run.glob("events.out.tfevents.*")):
        events = EventAccumulator(str(events_file))
        events.Reload()
        for tag in events.Tags()["scalars"]:
            logged.setdefault(tag, []).extend(e.value for e in events.Scalars(tag))
    return logged
{%- elif cookiecutter.logger == "csv" %}


def logged_scalars(run: Path) -> dict[str, list[float]]:
    """Every scalar the run logged, by name, in logging order (the run's metrics.csv)."""
    import csv

    logged: dict[str, list[float]] = {}
    with open(run / "metrics.csv", newline="") as file:
        for row in csv.DictReader(file):
            for name, value in row.items():
                if name not in ("epoch", "step") and value != "":
                    logged.setdefault(name, []).append(float(value))
    return logged
{%- elif cookiecutter.logger == "mlflow" %}


def run_dirs(root: Path) -> list[Path]:
    """The runs MLflow made in the local store under `root`, oldest first."""
    runs = [run for run in (root / "mlruns").glob("*/*") if (run / "meta.yaml").is_file()]
    return sorted(runs, key=lambda run: (run / "meta.yaml").stat().st_mtime)


def logged_scalars(run: Path) -> dict[str, list[float]]:
    """Every metric the run logged, by name, in logging order (lines of `timestamp value step`)."""
    metrics = run / "metrics"
    return {
        file.relative_to(metrics).as_posix(): [
            float(line.split()[1]) for line in file.read_text().splitlines()
        ]
        for file in sorted(metrics.rglob("*"))
        if file.is_file()
    }
{%- else %}


def run_dirs(root: Path) -> list[Path]:
    """The run directories under `root` (logs/<project>/<run id>, the W&B project that
    configs/default.yaml names), oldest first."""
    import yaml

    from .project import PROJECT

    logger = yaml.safe_load(PROJECT.defaults.read_text())["trainer"]["logger"]
    runs = (root / "logs" / logger["init_args"]["project"]).glob("*")
    return sorted(runs, key=lambda run: run.stat().st_mtime)


def wandb_records(path: Path):
    """The protobuf records of a W&B run file (LevelDB's log format, after a 7-byte header)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, position, pending, block = path.read_bytes(), 7, b"", 32768
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def logged_scalars(run: Path) -> dict[str, list[float]]:
    """Every metric the run logged, by name, in logging order (W&B's offline run files)."""
    import json
    import sys

    if "wandb" in sys.modules:
        # W&B's service, not the run, writes the run files: teardown waits until it has closed them.
        sys.modules["wandb"].teardown()
    logged: dict[str, list[float]] = {}
    files = sorted((run.parent.parent / "wandb").glob(f"offline-run-*-{run.name}/run-*.wandb"))
    for path in files:
        for record in wandb_records(path):
            if record.WhichOneof("record_type") != "history":
                continue
            for item in record.history.item:
                name = item.key or "/".join(item.nested_key)
                if not name.startswith("_") and name not in ("epoch", "trainer/global_step"):
                    logged.setdefault(name, []).append(float(json.loads(item.value_json)))
    return logged
{%- endif %}


def made_a_run(folder: Path) -> bool:
    """Whether anything a run writes (logs, a config, checkpoints) appeared in `folder`."""
    made = ("logs", "mlruns", "lightning_logs", "checkpoints", "config.yaml")
    return any((folder / name).exists() for name in made)


def folder_of(checkpoint: Path) -> Path:
    """The working directory a run's checkpoint was trained in (it holds logs/ or mlruns/)."""
    return next(p for p in checkpoint.parents if p.name in ("logs", "mlruns")).parent


def load_checkpoint(path: Path) -> dict:
    """A Lightning checkpoint, loaded the safe way (tensors and plain values only)."""
    return torch.load(path, map_location="cpu", weights_only=True)


def batches_of(checkpoint: dict) -> int:
    """The training batches a checkpoint's run had trained (a save after a batch's step
    counts it). Its `global_step` counts optimizer steps: one a batch for most models,
    one per optimizer for a model that steps several by hand (a GAN), fewer with
    gradient accumulation."""
    return checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["processed"]


def batches_trained(trainer) -> int:
    """The training batches a Trainer has trained (what `batches_of` reads once saved)."""
    return trainer.fit_loop.epoch_loop.batch_progress.total.processed


def assert_identical(ours, theirs, where: str = "") -> None:
    """Two checkpoint values (nested dicts, lists, tensors, numbers, strings) are equal,
    tensors bit for bit; the message names the first place they differ."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor) and ours.dtype == theirs.dtype, where
        assert ours.shape == theirs.shape and torch.equal(ours, theirs), where
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and ours.keys() == theirs.keys(), where
        for key in theirs:
            assert_identical(ours[key], theirs[key], f"{where}/{key}")
    elif isinstance(theirs, list | tuple):
        assert isinstance(ours, list | tuple) and len(ours) == len(theirs), where
        for index, (mine, other) in enumerate(zip(ours, theirs, strict=True)):
            assert_identical(mine, other, f"{where}/{index}")
    else:
        assert ours == theirs, f"{where}: {ours!r} != {theirs!r}"


def assert_float_close(ours, theirs, where: str = "", rtol: float = 1e-5) -> float:
    """Two checkpoint values (nested as in `assert_identical`) match, floating-point tensors
    within `rtol` of their largest magnitude, the rest exactly; BatchNorm's running
    statistics (each process's own under DDP) are left out. Returns the largest |d|."""
    if "running_" in where or "num_batches_tracked" in where:
        return 0.0
    if isinstance(theirs, torch.Tensor) and theirs.is_floating_point():
        assert isinstance(ours, torch.Tensor) and ours.shape == theirs.shape, where
        difference = float((ours.double() - theirs.double()).abs().max()) if theirs.numel() else 0.0
        scale = float(theirs.double().abs().max()) if theirs.numel() else 0.0
        assert difference <= rtol * scale, f"{where}: max |d| {difference}, max |value| {scale}"
        return difference
    if isinstance(theirs, dict | list | tuple):
        keys = theirs.keys() if isinstance(theirs, dict) else range(len(theirs))
        assert len(ours) == len(theirs), where
        return max(
            [assert_float_close(ours[key], theirs[key], f"{where}/{key}", rtol) for key in keys],
            default=0.0,
        )
    assert_identical(ours, theirs, where)
    return 0.0


def schedule_ended(checkpoint: dict) -> bool:
    """Whether a schedule of a fixed length (OneCycleLR's `total_steps`) in `checkpoint` took
    its last step: a fit that continues the run for more epochs is refused in one line."""
    return any(
        state.get("total_steps") is not None and state["last_epoch"] >= state["total_steps"]
        for state in checkpoint.get("lr_schedulers") or []
    )


def best_score(checkpoint: dict) -> float:
    """The monitored metric's best value, as the checkpoint callback recorded it."""
    (state,) = [s for s in checkpoint["callbacks"].values() if "best_model_score" in s]
    return float(state["best_model_score"])


def reached(score: float, target: float, mode: str) -> bool:
    """Whether `score` is at least as good as `target` for a metric where `mode` is better."""
    return score >= target if mode == "max" else score <= target
