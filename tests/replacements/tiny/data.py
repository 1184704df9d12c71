"""48 points on a line, split 32/8/8: with the default batch of 64, one batch a split."""

import torch
from torch.utils.data import Dataset, TensorDataset

from my_lightning_project.kit.data import SplitDataModule, split_dataset

POINTS = 48


class TinyDataModule(SplitDataModule):
    def __init__(
        self,
        batch_size: int = 64,
        num_workers: int | None = None,
        pin_memory: bool | None = None,
        split_seed: int = 42,
        predict_split: str = "test",
    ):
        super().__init__(batch_size, num_workers, pin_memory, split_seed, predict_split)

    def make_splits(self) -> dict[str, Dataset]:
        generator = torch.Generator().manual_seed(0)
        x = torch.linspace(-1, 1, POINTS).unsqueeze(1)
        y = 2 * x + 0.5 + 0.1 * torch.randn(POINTS, 1, generator=generator)
        return split_dataset(TensorDataset(x, y), [32, 8, 8], self.hparams.split_seed)
