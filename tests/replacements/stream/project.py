"""Next-value regression on a signal streamed from shard files: the model, the data, the metric.

The training split is an `IterableDataset` that shards itself over DDP ranks and loader
workers (data.py); the best checkpoint is the one with the lowest validation MSE.
"""

from .data import SignalDataModule
from .kit.spec import Project
from .model import NextValue

PROJECT = Project(
    model=NextValue,
    datamodule=SignalDataModule,
    monitor="val/mse",  # the metric that picks the best checkpoint
    mode="min",  # which way is better
)
# What the default `fit` reaches (`pytest -m target` holds it to that).
TARGET = 0.03
