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
    model=DigitsClassifier,  # a LightningModule: --model.* are its __init__ arguments
    datamodule=DigitsDataModule,  # a LightningDataModule: --data.* are its
    monitor="val/acc",  # logged by its validation_step; picks the best checkpoint
    mode="max",  # which way is better
)
TARGET = 0.97  # what the default `fit` reaches (`pytest -m target` holds it to that)
{%- else -%}
from .data import SyntheticRegressionDataModule
from .kit.spec import Project
from .model import Regressor

PROJECT = Project(
    model=Regressor,  # a LightningModule: --model.* are its __init__ arguments
    datamodule=SyntheticRegressionDataModule,  # a LightningDataModule: --data.* are its
    monitor="val/loss",  # logged by its validation_step; picks the best checkpoint
    mode="min",  # which way is better
)
TARGET = 0.03  # what the default `fit` reaches (`pytest -m target` holds it to that)
{%- endif %}
