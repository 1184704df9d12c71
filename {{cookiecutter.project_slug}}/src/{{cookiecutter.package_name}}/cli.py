"""The command line: Lightning's own CLI, with this project's defaults.

    {{ cookiecutter.project_slug }} fit                       # train the example
    {{ cookiecutter.project_slug }} fit --config configs/gpu.yaml --data.batch_size 256
    {{ cookiecutter.project_slug }} fit --print_config        # the full, resolved config
    {{ cookiecutter.project_slug }} validate|test|predict --ckpt_path <file>

`main(["fit", ...])` runs the same thing in-process, for tests and scripts.
"""

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from {{ cookiecutter.package_name }}.callbacks import EnvironmentReport
{%- if cookiecutter.example == "digits" %}
from {{ cookiecutter.package_name }}.data import DigitsDataModule as DataModule
from {{ cookiecutter.package_name }}.model import DigitsClassifier as Model

# The metric that picks the best checkpoint, and which way is better.
MONITOR, MODE = "val/acc", "max"
{%- else %}
from {{ cookiecutter.package_name }}.data import SyntheticRegressionDataModule as DataModule
from {{ cookiecutter.package_name }}.model import Regressor as Model

# The metric that picks the best checkpoint, and which way is better.
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


def console_main() -> None:
    """The `{{ cookiecutter.project_slug }}` command and `python -m {{ cookiecutter.package_name }}`."""
    main()
