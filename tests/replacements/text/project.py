"""A text classifier: which model and data the CLI uses, and the metric."""

from my_lightning_project.data import SentenceDataModule as DataModule
from my_lightning_project.model import TopicClassifier as Model

MONITOR = "val/acc"
MODE = "max"
TARGET = 0.9

__all__ = ["MODE", "MONITOR", "TARGET", "DataModule", "Model"]
