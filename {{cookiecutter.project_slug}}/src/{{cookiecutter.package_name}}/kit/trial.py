"""One trial of a sweep: a real `fit` of the project with the trial's flags.

Its run goes into the study's directory (or, for a trial tried again, continues
the run it left); Optuna's Lightning callback reports the monitored metric
after every validation and raises `optuna.TrialPruned` when the pruner says
stop. The trial's score is the best value of the metric, the one the best
checkpoint was kept for.
"""

import gc
import os
import signal
from functools import partial
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.exceptions import SIGTERMException
from optuna.trial import Trial
from optuna_integration import PyTorchLightningPruningCallback

from .cli import ProjectCLI, main
from .internals import subcommand_parser
from .runs import continue_run, place_new_runs, run_directory
from .spec import Project
from .stopping import STOP, Interrupted, SweepError


class TrialCLI(ProjectCLI):
    """The project's CLI for one trial: its run under the study, its config kept."""

    def __init__(self, *args, trial: Trial, folder: Path, resume: str | None, **kwargs) -> None:
        self.trial = trial
        self.folder = folder
        self.resume = resume
        super().__init__(*args, **kwargs)

    def place_run(self, config) -> None:
        # The config as the command line makes it, before the run is placed:
        # `fit --config` with it trains the same model again, as a run of its own.
        dumped = subcommand_parser(self, "fit").dump(config, skip_none=False)
        self.trial.set_user_attr("config", dumped)
        trainer = config.get("trainer", {})
        logger = trainer.get("logger")
        if self.resume and continue_run(logger, Path(self.resume)):
            config["ckpt_path"] = "last"  # its newest checkpoint, if it saved one
        elif not place_new_runs(logger, self.folder) and not logger:
            # No logger, no run directory: the checkpoints get a folder of their own.
            trainer["default_root_dir"] = str(self.folder / f"trial_{self.trial.number}")


class TrialRecord(Callback):
    """Tells the study where the trial's run is; and the sweep when Lightning itself
    handles SIGTERM (from the first training step on, it stops after a batch)."""

    def __init__(self, trial: Trial) -> None:
        self.trial = trial

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        run = run_directory(trainer)
        if trainer.logger is None:  # its checkpoints' folder
            run = Path(trainer.default_root_dir)
        if run is not None and trainer.is_global_zero:
            self.trial.set_user_attr("run", os.path.relpath(run))

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        STOP.fitting = True

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        STOP.fitting = False


def best_score(trainer: Trainer, monitor: str) -> float:
    """The trial's score: the best value of `monitor`, as the checkpoint callback kept it."""
    callback = trainer.checkpoint_callback
    score = getattr(callback, "best_model_score", None)
    if score is None or getattr(callback, "monitor", None) != monitor:
        score = trainer.callback_metrics.get(monitor)
    if score is None:
        raise RuntimeError(
            f"the run logged no '{monitor}', which the study optimises: log it in"
            " validation_step, or name the metric you log as Project.monitor in project.py"
        )
    return float(score)


def fit_trial(
    project: Project, trial: Trial, args: list[str], folder: Path, resume: str | None
) -> float:
    """Fit with `args` (the sweep's fit flags, then the trial's); the trial's score.

    Raises optuna.TrialPruned when pruned, Interrupted when SIGTERM or Ctrl-C
    stopped it, SweepError when fit refused the flags.
    """
    cli_class = partial(TrialCLI, trial=trial, folder=folder, resume=resume)
    monitor = project.monitor
    callbacks: list[Callback] = [
        PyTorchLightningPruningCallback(trial, monitor=monitor),
        TrialRecord(trial),
    ]
    try:
        cli = main(["fit", *args], project, callbacks=callbacks, cli_class=cli_class)
    except SIGTERMException as stop:
        raise Interrupted(signal.SIGTERM) from stop
    except SystemExit as stop:  # Lightning's end of a Ctrl-C, or a refused flag
        if STOP.signum is not None:
            raise Interrupted(STOP.signum) from stop
        raise SweepError(
            f"fit refused the trial's flags (exit {stop.code}, its message is above):"
            " fix the search space or the flags after --"
        ) from stop
    finally:
        STOP.fitting = False
    try:
        return best_score(cli.trainer, monitor)
    finally:
        del cli
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
