"""An image classifier over PNG files read per item, with random augmentation in training.

Three synthetic shapes (data.py), a tiny CNN (model.py); the best checkpoint is the one
with the highest validation accuracy.
"""

from .data import ShapesDataModule
from .kit.spec import Project
from .model import ShapeClassifier

PROJECT = Project(
    model=ShapeClassifier,
    datamodule=ShapesDataModule,
    monitor="val/acc",  # the metric that picks the best checkpoint
    mode="max",  # which way is better
)
# What the default `fit` reaches (`pytest -m target` holds it to that).
TARGET = 0.9
