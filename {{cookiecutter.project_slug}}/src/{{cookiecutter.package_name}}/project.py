"""What this project trains: the one place that names the model, the data and the metric.

The kit reads everything it needs of your code from `PROJECT` (kit/spec.py
lists each field, with its default). To train your own model, point `model`
and `datamodule` at your classes and `monitor` at a metric your
`validation_step` logs (README, "Make it yours").
"""

{% if cookiecutter.example == "digits" -%}
from .data import DigitsDataModule
from .kit.spec import Project
from .model import DigitsClassifier

PROJECT = Project(
    model=DigitsClassifier,
    datamodule=DigitsDataModule,
    monitor="val/acc",  # the metric that picks the best checkpoint
    mode="max",  # which way is better
)
# What the default `fit` reaches (`pytest -m target` holds it to that).
TARGET = 0.97
{%- else -%}
from .data import SyntheticRegressionDataModule
from .kit.spec import Project
from .model import Regressor

PROJECT = Project(
    model=Regressor,
    datamodule=SyntheticRegressionDataModule,
    monitor="val/loss",  # the metric that picks the best checkpoint
    mode="min",  # which way is better
)
# What the default `fit` reaches (`pytest -m target` holds it to that; the noise
# floor of the data is 0.1**2 = 0.01).
TARGET = 0.03
{%- endif %}
