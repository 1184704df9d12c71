"""48 points on a line, split 32/8/8: with the default batch of 64, one batch a split."""

import torch
from torch.utils.data import Dataset, TensorDataset

from my_lightning_project.kit.data import SplitDataModule, split_dataset

POINTS = 48


class TinyDataModule(SplitDataModule):
    # SplitDataModule's own arguments, inherited: the shipped configs set some of them.

    def make_splits(self) -> dict[str, Dataset]:
        generator = torch.Generator().manual_seed(0)
        x = torch.linspace(-1, 1, POINTS).unsqueeze(1)
        y = 2 * x + 0.5 + 0.1 * torch.randn(POINTS, 1, generator=generator)
        return split_dataset(TensorDataset(x, y), [32, 8, 8], self.hparams.split_seed)
