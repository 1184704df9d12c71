"""Lightning's demo Transformer on a synthetic language: the model, the data and the metric."""

from .data import CountingDataModule
from .kit.spec import Project
from .model import CountingTransformer, network_inputs

PROJECT = Project(
    model=CountingTransformer,
    datamodule=CountingDataModule,
    monitor="val/loss",  # the metric that picks the best checkpoint
    mode="min",  # which way is better
    network_inputs=network_inputs,  # the demo network takes the target too
)
# What the default `fit` reaches (`pytest -m target` holds it to that; ln(16) = 2.77 at
# the start).
TARGET = 1.0
