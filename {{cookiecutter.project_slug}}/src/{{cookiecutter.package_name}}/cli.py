"""The command line: Lightning's own CLI, with this project's defaults.

    {{ cookiecutter.project_slug }} fit                       # train the example
    {{ cookiecutter.project_slug }} fit --config configs/gpu.yaml --data.batch_size 256
    {{ cookiecutter.project_slug }} fit --print_config        # the full, resolved config
    {{ cookiecutter.project_slug }} validate|test|predict --ckpt_path <file>

`main(["fit", ...])` runs the same thing in-process, for tests and scripts;
`run` is the command line's wrapper around it (error hints, exit code).
"""

import sys
import traceback

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from {{ cookiecutter.package_name }}.callbacks import EnvironmentReport, FailureContext
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
    "logger": {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
        "init_args": {"save_dir": "logs", "name": "{{ cookiecutter.example }}"},
    },
}


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
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
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
        # Precision from the hardware unless given (--trainer.precision wins);
        # --print_config shows the resolved value.
        parser.set_defaults({"trainer.precision": resolve_precision(*cuda_capabilities())})

    def before_instantiate_classes(self) -> None:
        use_tensor_cores()
        # What the error hints quote if building the Trainer already fails.
        config = self.config.get(self.subcommand, self.config)
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
        **cli_kwargs,
    )


def run(args: list[str] | None = None) -> int:
    """`main` for the command line: a known error gets a hint after its traceback.

    Nothing is swallowed: the traceback is printed in full and the exit code is 1.
    """
    try:
        main(args)
    except Exception as error:
        traceback.print_exc()
        hint = explain(error)
        if hint:
            print(hint, file=sys.stderr)
        return 1
    return 0
