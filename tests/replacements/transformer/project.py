"""Lightning's demo Transformer on a synthetic language: which model and data, and the metric."""

from my_lightning_project.data import CountingDataModule as DataModule
from my_lightning_project.model import CountingTransformer as Model

MONITOR = "val/loss"
MODE = "min"
TARGET = 1.0  # ln(16) = 2.77 at the start

__all__ = ["MODE", "MONITOR", "TARGET", "DataModule", "Model"]
