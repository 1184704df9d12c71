"""What this project trains: the one place that names the model, the data and the metric.

The CLI, the checkpoints, `export` and the kit's tests all read these names.
To train your own model, point `Model` and `DataModule` at your classes and
`MONITOR` at a metric your `validation_step` logs (README, "Make it yours").
"""

{% if cookiecutter.example == "digits" -%}
from {{ cookiecutter.package_name }}.data import DigitsDataModule as DataModule
from {{ cookiecutter.package_name }}.model import DigitsClassifier as Model

# The metric that picks the best checkpoint, which way is better, and what the
# default `fit` must reach (tests/test_cli.py holds every render to it).
MONITOR = "val/acc"
MODE = "max"
TARGET = 0.97
{%- else -%}
from {{ cookiecutter.package_name }}.data import SyntheticRegressionDataModule as DataModule
from {{ cookiecutter.package_name }}.model import Regressor as Model

# The metric that picks the best checkpoint, which way is better, and what the
# default `fit` must reach (tests/test_cli.py holds every render to it; the
# noise floor of the data is 0.1**2 = 0.01).
MONITOR = "val/loss"
MODE = "min"
TARGET = 0.03
{%- endif %}

__all__ = ["MODE", "MONITOR", "TARGET", "DataModule", "Model"]
