"""scikit-learn's breast-cancer table (no download): 569 rows of 30 features, two classes.

Split 70/15/15 by `split_seed`; every split is standardised with the mean and standard
deviation of the training split alone. Those statistics are the DataModule's state
(`state_dict`), so a checkpoint carries them: what the model was trained on can be
reproduced for new rows without the training data.
"""

from typing import Any

import torch
from torch.utils.data import Dataset, TensorDataset

from .kit.data import SplitDataModule, split_dataset, split_sizes

NUM_ROWS = 569
NUM_FEATURES = 30


def load_table() -> tuple[torch.Tensor, torch.Tensor]:
    """(features, labels): float32 of shape (569, 30), and 0 (malignant) or 1 (benign)."""
    from sklearn.datasets import load_breast_cancer

    table = load_breast_cancer()
    features = torch.tensor(table.data, dtype=torch.float32)
    return features, torch.tensor(table.target, dtype=torch.float32)


class CancerDataModule(SplitDataModule):
    """The breast-cancer rows, standardised with the training split's statistics."""

    def __init__(self, val_fraction: float = 0.15, test_fraction: float = 0.15, **kwargs):
        super().__init__(**kwargs)
        self.sizes = split_sizes(NUM_ROWS, val_fraction, test_fraction)
        # Set by `make_splits` from the training split, or by `load_state_dict`.
        self.mean: torch.Tensor | None = None
        self.std: torch.Tensor | None = None

    def standardise(self, features: torch.Tensor) -> torch.Tensor:
        """Rows of features in units of the training split's standard deviations."""
        if self.mean is None or self.std is None:
            raise RuntimeError("no statistics yet: call setup() or load_state_dict() first")
        return (features - self.mean) / self.std

    def make_splits(self) -> dict[str, Dataset]:
        features, labels = load_table()
        numbers = TensorDataset(torch.arange(NUM_ROWS))
        rows = split_dataset(numbers, self.sizes, self.hparams.split_seed)
        indices = {name: torch.as_tensor(split.indices) for name, split in rows.items()}
        if self.mean is None or self.std is None:  # not restored from a checkpoint
            train = features[indices["train"]]
            self.mean, self.std = train.mean(dim=0), train.std(dim=0).clamp_min(1e-6)
        return {
            name: TensorDataset(self.standardise(features[index]), labels[index])
            for name, index in indices.items()
        }

    def state_dict(self) -> dict[str, Any]:
        if self.mean is None or self.std is None:
            return {}
        return {"mean": self.mean.tolist(), "std": self.std.tolist()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        mean = torch.tensor(state_dict["mean"], dtype=torch.float32)
        std = torch.tensor(state_dict["std"], dtype=torch.float32)
        # Lightning restores a checkpoint after `setup`: the splits were standardised already.
        made = self.mean is not None and self.std is not None
        if made and not (torch.equal(mean, self.mean) and torch.equal(std, self.std)):
            raise ValueError(
                "the checkpoint's feature statistics are not those of this training split "
                "(another data.split_seed or split fractions?)"
            )
        self.mean, self.std = mean, std
