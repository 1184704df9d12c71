"""The command line: Lightning's own CLI, with this project's defaults.

    {{ cookiecutter.project_slug }} fit                       # train the example
    {{ cookiecutter.project_slug }} fit --config configs/gpu.yaml --data.batch_size 256
    {{ cookiecutter.project_slug }} fit --print_config        # the full, resolved config
    {{ cookiecutter.project_slug }} fit --ckpt_path last      # continue the newest run
    {{ cookiecutter.project_slug }} validate|test|predict --ckpt_path <file>

`main(["fit", ...])` runs the same thing in-process, for tests and scripts;
`run` is the command line's wrapper around it (error hints, exit code).
"""

import os
import sys
import traceback

import torch
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from {{ cookiecutter.package_name }}.callbacks import (
    EnvironmentReport,
    FailureContext,
    PredictionWriter,
)
from {{ cookiecutter.package_name }}.checkpoints import (
    BestAndLast,
    CheckpointError,
    InterruptCheckpoint,
    check_checkpoint,
    resolve_last,
)
{%- if cookiecutter.example == "digits" %}
from {{ cookiecutter.package_name }}.data import DigitsDataModule as DataModule
{%- else %}
from {{ cookiecutter.package_name }}.data import SyntheticRegressionDataModule as DataModule
{%- endif %}
from {{ cookiecutter.package_name }}.hardware import (
    cuda_capabilities,
    resolve_precision,
    use_tensor_cores,
)
from {{ cookiecutter.package_name }}.health import TrainingHealth
from {{ cookiecutter.package_name }}.hints import RUN_CONTEXT, explain
{%- if cookiecutter.example == "digits" %}
from {{ cookiecutter.package_name }}.model import DigitsClassifier as Model
{%- else %}
from {{ cookiecutter.package_name }}.model import Regressor as Model
{%- endif %}

# The metric that picks the best checkpoint, and which way is better.
{%- if cookiecutter.example == "digits" %}
MONITOR, MODE = "val/acc", "max"
{%- else %}
MONITOR, MODE = "val/loss", "min"
{%- endif %}

TRAINER_DEFAULTS = {
    "max_epochs": 20,
    # A few dozen steps an epoch here: log often enough to see a curve.
    "log_every_n_steps": 10,
{%- if cookiecutter.logger == "tensorboard" %}
    "logger": {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
        "init_args": {"save_dir": "logs", "name": "{{ cookiecutter.example }}"},
    },
{%- elif cookiecutter.logger == "csv" %}
    "logger": {
        "class_path": "lightning.pytorch.loggers.CSVLogger",
        "init_args": {"save_dir": "logs", "name": "{{ cookiecutter.example }}"},
    },
{%- else %}
    # A local MLflow file store under mlruns/: no server, works offline.
    "logger": {
        "class_path": "lightning.pytorch.loggers.MLFlowLogger",
        "init_args": {"experiment_name": "{{ cookiecutter.example }}", "save_dir": "mlruns"},
    },
{%- endif %}
}
{%- if cookiecutter.logger == "mlflow" %}
# MLflow 3 keeps its file store in maintenance mode and refuses it unless asked:
# a local folder needs no database or server. For a database, pass
# --trainer.logger.init_args.tracking_uri sqlite:///mlflow.db (needs sqlalchemy).
os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
{%- endif %}


class SaveRunConfig(SaveConfigCallback):
    """Lightning's config.yaml, written into the run's own directory for every logger.

    TensorBoard and CSV runs already get it there; other loggers (MLflow) would
    share one file at the top of their store, overwritten by every run.
    """

    def setup(self, trainer, pl_module, stage: str) -> None:
        logger = trainer.logger
        if self.already_saved or isinstance(logger, (type(None), TensorBoardLogger, CSVLogger)):
            super().setup(trainer, pl_module, stage)
            return
        # Where the checkpoints of the run go too: <save_dir>/<name>/<version>.
        root = logger.save_dir or trainer.default_root_dir
        run_dir = os.path.join(root, str(logger.name), str(logger.version))
        run_dir = trainer.strategy.broadcast(run_dir)
        if trainer.is_global_zero:
            os.makedirs(run_dir, exist_ok=True)
            path = os.path.join(run_dir, self.config_filename)
            self.parser.save(self.config, path, skip_none=False, overwrite=True)
            self.save_config(trainer, pl_module, stage)
        self.already_saved = True


class ProjectCLI(LightningCLI):
    """LightningCLI plus the callbacks every run of this project gets."""

    def __init__(self, *args, **kwargs) -> None:
        words = kwargs.get("args")
        words = sys.argv[1:] if words is None else words
        first = words[0] if isinstance(words, list) and words else None
        # Each subcommand's parser costs ~0.2 s to build: build only the one asked for.
        self._only = first if first in LightningCLI.subcommands() else None
        super().__init__(*args, **kwargs)

    def subcommands(self) -> dict[str, set[str]]:
        everything = LightningCLI.subcommands()
        if self._only is None:
            return everything
        return {self._only: everything[self._only]}

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # Always on, and configurable as --checkpoint.* (best and last).
        parser.add_lightning_class_args(BestAndLast, "checkpoint")
        parser.set_defaults(
            {
                "checkpoint.monitor": MONITOR,
                "checkpoint.mode": MODE,
                "checkpoint.save_top_k": 1,
                "checkpoint.save_last": True,
                "checkpoint.filename": "best-epoch{epoch:02d}-step{step}",
                "checkpoint.auto_insert_metric_name": False,
            }
        )
        parser.add_lightning_class_args(EnvironmentReport, "environment_report")
        parser.add_lightning_class_args(TrainingHealth, "health")
        parser.add_lightning_class_args(FailureContext, "failure_context")
        parser.add_lightning_class_args(InterruptCheckpoint, "interrupt_checkpoint")
        parser.add_lightning_class_args(PredictionWriter, "predictions")
        # Precision from the hardware unless given (--trainer.precision wins);
        # --print_config shows the resolved value.
        parser.set_defaults({"trainer.precision": resolve_precision(*cuda_capabilities())})

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        super().parse_arguments(parser, args)
        config = self.config.get(self.config.get("subcommand") or "")
        if config is None:
            return
{%- if cookiecutter.logger == "mlflow" %}
        logger = config.get("trainer", {}).get("logger")
        init = getattr(logger, "init_args", None)
        if init is not None and "tracking_uri" in init and not init.get("tracking_uri"):
            # MLflow caches its store by URI: a relative one would follow the
            # working directory of the first run made in this process.
            init["save_dir"] = os.path.abspath(init.get("save_dir") or "mlruns")
{%- endif %}
        # Before Lightning reads the checkpoint's hyperparameters:
        # `--ckpt_path last` becomes the newest checkpoint of the newest run
        # (and the logger continues that run); a damaged file is refused by name.
        resolve_last(config)
        ckpt_path = config.get("ckpt_path")
        if ckpt_path not in (None, "last", "best", "hpc"):
            check_checkpoint(ckpt_path)

    def before_instantiate_classes(self) -> None:
        use_tensor_cores()
        config = self.config.get(self.subcommand, self.config)
        if "weights_only" in config and config.get("weights_only") is None:
            # Tensors and plain values only: a checkpoint cannot run code when loaded.
            config["weights_only"] = True
        # What the error hints quote if building the Trainer already fails.
        trainer = config.get("trainer", {})
        RUN_CONTEXT.clear()
        RUN_CONTEXT.update(
            batch_size=config.get("data", {}).get("batch_size"),
            precision=trainer.get("precision"),
            accumulate_grad_batches=trainer.get("accumulate_grad_batches"),
            devices=trainer.get("devices"),
            accelerator=trainer.get("accelerator"),
        )


def main(args: list[str] | None = None, **cli_kwargs) -> ProjectCLI:
    """Run the CLI on `args` (default: the command line).

    `cli_kwargs` go to LightningCLI: `main([...], run=False)` only builds the
    model, data and trainer, as tests and notebooks want.
    """
    return ProjectCLI(
        Model,
        DataModule,
        args=args,
        trainer_defaults=TRAINER_DEFAULTS,
        seed_everything_default=42,
        # The model injects its own optimizer (--model.optimizer), so the
        # CLI's generic --optimizer/--lr_scheduler groups stay off.
        auto_configure_optimizers=False,
        # config.yaml goes into the run's directory, beside checkpoints/; a
        # resumed run rewrites it in the directory it continues.
        save_config_callback=SaveRunConfig,
        save_config_kwargs={"overwrite": True},
        **cli_kwargs,
    )


def run(args: list[str] | None = None) -> int:
    """`main` for the command line: a known error gets a hint after its traceback.

    Nothing is swallowed: the traceback is printed in full and the exit code is
    1; 2 for an unusable checkpoint file (the message says which and why); 143
    (128 + SIGTERM) when a scheduler stopped the run.
    """
    try:
        main(args)
    except CheckpointError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except SIGTERMException:
        print(f"{_rank()}stopped by SIGTERM; resume with `fit --ckpt_path last`", file=sys.stderr)
        return 143
    except Exception as error:
        traceback.print_exc()
        print(f"{_rank()}failed: {type(error).__name__}: {error}", file=sys.stderr)
        hint = explain(error)
        if hint:
            print(hint, file=sys.stderr)
        return 1
    return 0


def _rank() -> str:
    """'[rank 1/2] ' under DDP, so a failure says which process it was; '' alone."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        world = torch.distributed.get_world_size()
    rank = getattr(rank_zero_only, "rank", 0)
    return f"[rank {rank}/{world}] " if world > 1 else ""
