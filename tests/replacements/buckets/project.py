"""A classifier of variable-size sets of 2-D points, batched by the user's own sampler.

Sets of 5 to 60 points on a circle or along a segment (data.py), bucketed by size under a
budget of points per training batch; DeepSets (model.py). The best checkpoint is the one
with the highest validation accuracy.
"""

from .data import PointSetsDataModule
from .kit.spec import Project
from .model import SetClassifier, network_inputs

PROJECT = Project(
    model=SetClassifier,
    datamodule=PointSetsDataModule,
    monitor="val/acc",  # the metric that picks the best checkpoint
    mode="max",  # which way is better
    network_inputs=network_inputs,  # a NamedTuple batch: the network takes points and mask
    dynamic_dims={0: "batch", 1: "points"},  # exports take sets of any size
)
# What the default `fit` reaches (`pytest -m target` holds it to that).
TARGET = 0.95
