"""Run directories: one per run, the same one when a run continues, none for a run
that never took a step.

A run writes its config, metrics and checkpoints into one directory: under
TensorBoard or CSV `<save_dir>/<name>/version_N`, under MLflow
`<save_dir>/<experiment id>/<run id>`, under Weights & Biases
`<save_dir>/<project>/<run id>` (W&B keeps its own record of the run in
`<save_dir>/wandb/`). `fit --ckpt_path last` and `validate` or
`test` with a checkpoint of a run log into that run's directory, so its
evaluation sits beside its training curves.
"""

import csv
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger
from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import DummyLogger, rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_info

from .internals import filesystem, open_experiment, set_experiment
from .schedules import ending_schedules

# What `test --ckpt_path` measured, in the run it tested, by checkpoint file.
TEST_METRICS = "test_metrics.json"


def _init_args(logger: Any) -> Any | None:
    """The init_args of a logger given in the config as class_path/init_args, else None."""
    if not hasattr(logger, "get") or not logger.get("class_path"):
        return None
    return logger.get("init_args")


def _is_wandb(init: Any) -> bool:
    return "project" in init and "log_model" in init and "run_id" not in init


def uploads_each_checkpoint(logger: Any) -> bool:
    """Whether a configured logger uploads each checkpoint as it is saved (`log_model: all`)."""
    loggers = logger if isinstance(logger, list) else [logger]
    return any((_init_args(one) or {}).get("log_model") == "all" for one in loggers)


def run_candidates(logger: Any) -> list[Path]:
    """The run directories the configured logger may continue (all of them unless it names one)."""
    init = _init_args(logger)
    if init is None:
        return []
    if "run_id" in init:  # MLflow: <save_dir>/<experiment id>/<run id>
        save_dir = Path(init.get("save_dir") or "mlruns")
        runs = save_dir.glob(f"*/{init.get('run_id') or '*'}")
        return [run for run in runs if (run / "meta.yaml").is_file()]
    if _is_wandb(init):  # <save_dir>/<project>/<run id>
        experiment = Path(init.get("save_dir") or ".") / str(init.get("project") or "")
        named = init.get("id") or init.get("version")
        runs = [experiment / named] if named else experiment.glob("*")
        return [run for run in runs if run.is_dir()]
    experiment = Path(init.get("save_dir") or ".") / str(init.get("name") or "")
    version = init.get("version")
    if version is None:
        return [run for run in experiment.glob("*") if run.is_dir()]
    if isinstance(version, int):
        version = f"version_{version}"
    return [experiment / str(version)]


def continue_run(logger: Any, run: Path) -> bool:
    """Point the configured logger at the existing run directory `run`; False if it cannot."""
    init = _init_args(logger)
    if init is None:
        return False
    if "run_id" in init:
        if init.get("tracking_uri"):  # a server: its runs are not directories here
            return False
        init["save_dir"] = str(run.parent.parent)
        init["run_id"] = run.name
        return True
    if _is_wandb(init):
        init["save_dir"], init["project"] = str(run.parent.parent), run.parent.name
        init["id"], init["version"] = None, run.name  # the run id: W&B continues the same run
        return True
    init["save_dir"] = str(run.parent.parent)
    init["name"] = run.parent.name
    # version_N as the number, so the progress bar shows v_num=N (not the name's last 4 letters).
    number = run.name.removeprefix("version_")
    init["version"] = int(number) if number.isdigit() and number != run.name else run.name
    return True


def place_new_runs(logger: Any, folder: Path) -> bool:
    """Point the configured logger's new runs into `folder`: `<folder>/trials/version_N`
    under TensorBoard or CSV, `<folder>/trials/<run id>` under W&B (its records in
    `<folder>/wandb`), a store of their own in `<folder>/mlruns` under MLflow.
    False (and nothing changed) for a logger whose runs are not directories here."""
    init = _init_args(logger)
    if init is None:
        return False
    if "run_id" in init:
        if init.get("tracking_uri"):  # a server keeps the runs
            return False
        init["save_dir"] = str((folder / "mlruns").absolute())
        init["run_id"] = None
        return True
    if _is_wandb(init):
        init["save_dir"] = str(folder.absolute())
        init["project"] = "trials"
        init["id"] = init["version"] = None
        return True
    if "save_dir" in init and "name" in init and "version" in init:
        init["save_dir"] = str(folder)
        init["name"] = "trials"
        init["version"] = None
        return True
    return False


def run_of_checkpoint(path: Path) -> Path | None:
    """The run directory a checkpoint was saved in (`<run>/checkpoints/<file>`), else None."""
    run = path.parent.parent
    if path.parent.name != "checkpoints":
        return None
    if (run / "config.yaml").is_file() or (run / "meta.yaml").is_file():
        return run
    return None


def run_directory(trainer: Trainer) -> Path | None:
    """Where this run writes its config, metrics and checkpoints; None without a logger
    (and under `fast_dev_run`, whose stand-in logger writes nothing)."""
    logger = trainer.logger
    if logger is None or isinstance(logger, DummyLogger):
        return None
    log_dir = getattr(logger, "log_dir", None)
    if log_dir:
        return Path(log_dir)
    if not logger.name or not logger.version:
        return None
    return Path(logger.save_dir or trainer.default_root_dir, str(logger.name), str(logger.version))


def is_first_process() -> bool:
    """Whether this is global rank 0 (or a process that is not part of a launched job).
    (Before the Trainer sets it, Lightning's `rank_zero_only.rank` reads no NODE_RANK: the
    first process of node 1 under Lightning's own launcher would pass as rank 0.)"""
    ranks = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")
    return all(os.environ.get(name, "0") == "0" for name in ranks)


def claim_new_run(logger: Any) -> Path | None:
    """Create the next `version_N` directory of the configured logger and point the
    logger at it; None where the logger names its run itself (or has no versions).

    Lightning picks `version_N` by listing the folder, so two runs started at
    the same moment could pick the same one. `mkdir` is atomic: a run that
    loses the race takes the next number.
    """
    init = _init_args(logger)
    if init is None or "version" not in init or init.get("version") is not None:
        return None
    if _is_wandb(init):  # W&B draws a random run id: no two runs share it
        return None
    experiment = Path(init.get("save_dir") or ".") / str(init.get("name") or "")
    experiment.mkdir(parents=True, exist_ok=True)
    numbers = [p.name.removeprefix("version_") for p in experiment.glob("version_*")]
    number = max((int(n) for n in numbers if n.isdigit()), default=-1) + 1
    while True:
        try:
            (experiment / f"version_{number}").mkdir()
            break
        except FileExistsError:
            number += 1
    init["version"] = number
    return experiment / f"version_{number}"


def discard_run(run: Path) -> None:
    """Delete a run directory, and the logger's folder above it if that is left empty.

    In an MLflow store (`<store>/<experiment>/<run>`, the experiment's folder holding
    a meta.yaml) "empty" means without runs: the experiment goes when it has no other
    run, and the store when none of its experiments has one.
    """
    shutil.rmtree(run, ignore_errors=True)
    experiment = run.parent
    records = experiment.parent / "wandb"
    if records.is_dir():  # W&B: its own record of the run, `<save_dir>/wandb/*-<run id>`
        for record in records.glob(f"*-{run.name}"):
            shutil.rmtree(record, ignore_errors=True)
        if not any(entry.is_dir() and not entry.is_symlink() for entry in records.iterdir()):
            shutil.rmtree(records, ignore_errors=True)  # its debug logs and latest-run link
        for folder in (experiment, experiment.parent):
            try:
                folder.rmdir()  # only when empty
            except FileNotFoundError:
                continue
            except OSError:
                break
        return
    if (experiment / "meta.yaml").is_file():
        if _without_runs(experiment):
            shutil.rmtree(experiment, ignore_errors=True)
        store = experiment.parent
        if store.is_dir() and all(
            _without_runs(entry) for entry in store.iterdir() if entry.is_dir()
        ):
            shutil.rmtree(store, ignore_errors=True)
        return
    try:
        experiment.rmdir()  # only when empty
    except OSError:
        pass


def _without_runs(folder: Path) -> bool:
    """An MLflow experiment's folder (or its .trash) that holds no run."""
    return not any(entry.is_dir() and entry.name != "tags" for entry in folder.iterdir())


def _finalized(status: str = "success") -> None:
    """A logger's finalize once it has run."""


class DiscardFailedStart(Callback):
    """Removes the run directory of a new run that failed before its first step
    (or an evaluation that failed).

    `new_run`: the command started a run of its own (a continued run is never
    touched).
    """

    def __init__(self, new_run: bool = False) -> None:
        self.new_run = new_run
        self._run: Path | None = None
        self._stage: str = ""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._stage = stage
        self._run = run_directory(trainer) if self.new_run and trainer.is_global_zero else None

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        trained = self._stage == "fit" and trainer.global_step > 0
        if self._run is None and self.new_run and trainer.is_global_zero and not self._stage:
            self._run = run_directory(trainer)  # a DataModule's setup failed: before this one's
        # (A W&B run's directory appears with its first checkpoint, its record at once.)
        if self._run is None or trained:
            return
        # Lightning finalizes the loggers after this hook; an MLflow run whose
        # folder is gone would fail there. Finalize them now, once.
        for logger in trainer.loggers:
            logger.finalize("failed")
            logger.finalize = _finalized  # type: ignore[method-assign]
            end_logger_run(logger)
        discard_run(self._run)
        rank_zero_info(f"Removed {self._run}: the run failed before it had results")


def shown_path(path: str | Path) -> str:
    """A path as a command line wants it: relative to here when it is under here."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def curves_command(trainer: Trainer) -> str | None:
    """How to look at this run's curves, for the logger it has (a command, a file or
    an address); None without a logger."""
    logger = trainer.logger
    if isinstance(logger, TensorBoardLogger):
        return f"tensorboard --logdir {shown_path(logger.root_dir)}"
    if isinstance(logger, LightningCSVLogger):
        return shown_path(Path(logger.log_dir) / "metrics.csv")
    if isinstance(logger, MLFlowLogger):
        if logger.save_dir:  # a local store
            store = shown_path(logger.save_dir)
            return f"MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri {store}"
        return f"the MLflow server's UI, run {logger.run_id}"
    if isinstance(logger, WandbLogger):
        run = open_experiment(logger)
        if run is None:
            return None
        if getattr(run.settings, "mode", "") in ("offline", "dryrun"):
            return f"wandb sync {shown_path(Path(run.dir).parent)}"
        return str(run.url)
    return None


class FitResult(Callback):
    """Ends a fit with one line: its result, where it is, and how to go on.

    The line gives the best score and its epoch, the best checkpoint, how to look at
    the run and how to continue it.

    Args:
        enabled: print the line (rank 0 only).
        command: the project's console command, which the line names (the CLI gives it).
    """

    def __init__(self, enabled: bool = True, command: str = "<command>") -> None:
        self.enabled = enabled
        self.command = command  # the project's console command
        self._line: str | None = None

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.enabled and trainer.is_global_zero:
            self._line = self.line(trainer)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Printed last: after what the loggers print as their runs end.
        line, self._line = self._line, None
        if line:
            print(line, file=sys.stderr)

    def line(self, trainer: Trainer) -> str | None:
        checkpoint = trainer.checkpoint_callback
        if checkpoint is None:
            return None
        parts = []
        if checkpoint.best_model_path and checkpoint.best_model_score is not None:
            epoch = getattr(checkpoint, "best_epoch", None)
            at = f" at epoch {epoch}" if epoch is not None else ""
            score, path = float(checkpoint.best_model_score), checkpoint.best_model_path
            parts.append(f"Best {checkpoint.monitor} {score:.4g}{at}: {shown_path(path)}")
        elif checkpoint.last_model_path:
            parts.append(f"Last checkpoint: {shown_path(checkpoint.last_model_path)}")
        else:
            return None
        curves = curves_command(trainer)
        if curves:
            parts.append(f"curves: {curves}")
        further = ""
        if trainer.max_epochs and trainer.current_epoch >= trainer.max_epochs:
            ending = [name for name, _, _ in ending_schedules(trainer)]
            if ending:  # a schedule built for this run's steps ends with it
                parts.append(f"its {ending[0]} ends with this run: train further in a new one")
                return " | ".join(parts)
            further = f" --trainer.max_epochs {2 * trainer.max_epochs}"
        if type(trainer.strategy).__name__ == "FSDP2Strategy":  # its checkpoints are shards
            further += " --fsdp.enabled true"
        parts.append(f"continue: {self.command} fit --ckpt_path last{further}")
        return " | ".join(parts)


class KeepTestMetrics(Callback):
    """Keeps what `test --ckpt_path` measured beside the run it tested, in
    `<run>/test_metrics.json` by checkpoint file, where an export's model card reads it."""

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        run = run_directory(trainer)
        if not trainer.is_global_zero or run is None or not trainer.ckpt_path:
            return
        metrics = {
            name: float(value)
            for name, value in trainer.callback_metrics.items()
            if getattr(value, "numel", lambda: 1)() == 1
        }
        path = run / TEST_METRICS
        try:
            kept = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        except ValueError:
            kept = {}
        kept[Path(trainer.ckpt_path).name] = metrics
        run.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text(json.dumps(kept, indent=2) + "\n", encoding="utf-8")
        os.replace(partial, path)


class FinishRun(Callback):
    """Ends the logger's run when the command ends (Lightning leaves a W&B run open,
    so another command in the same process could not continue it)."""

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                end_logger_run(logger)


def end_logger_run(logger: Any) -> None:
    """Finish the W&B run a logger holds, if it holds one."""
    finish = getattr(open_experiment(logger), "finish", None)
    if callable(finish):
        finish()
        set_experiment(logger, None)


def end_open_runs() -> None:
    """Finish a W&B run that an earlier command in this process left open (one that
    failed before its teardown): W&B would give the next command's logger that run."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()


class _ContinuingWriter(ExperimentWriter):
    def _check_log_dir_exists(self) -> None:
        # Lightning's writer deletes an existing metrics.csv; a continued run appends to it.
        fs = filesystem(self)
        if fs.isfile(self.metrics_file_path):
            with fs.open(self.metrics_file_path, "r", newline="") as file:
                self.metrics_keys = next(csv.reader(file), [])


class CSVLogger(LightningCSVLogger):
    """Lightning's CSVLogger, except that a continued run appends to its metrics.csv."""

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if open_experiment(self) is None:
            filesystem(self).makedirs(self.root_dir, exist_ok=True)
            set_experiment(self, _ContinuingWriter(log_dir=self.log_dir))
        return open_experiment(self)
