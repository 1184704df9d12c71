"""A price regression from a CSV file: which model and data the CLI uses, and the metric."""

from my_lightning_project.data import HousesDataModule as DataModule
from my_lightning_project.model import PricePredictor as Model

MONITOR = "val/mae"  # lower is better
MODE = "min"
TARGET = 0.35

__all__ = ["MODE", "MONITOR", "TARGET", "DataModule", "Model"]
