"""A synthetic language: each sequence counts up from a random token, with some noise."""

import torch
from torch.utils.data import Dataset, TensorDataset

from my_lightning_project.kit.data import SplitDataModule, split_dataset, split_sizes

VOCABULARY, LENGTH, SEQUENCES = 16, 9, 400


class CountingDataModule(SplitDataModule):
    def __init__(
        self,
        batch_size: int = 32,
        num_workers: int | None = None,
        pin_memory: bool | None = None,
        split_seed: int = 42,
        predict_split: str = "test",
    ):
        super().__init__(batch_size, num_workers, pin_memory, split_seed, predict_split)

    def make_splits(self) -> dict[str, Dataset]:
        generator = torch.Generator().manual_seed(self.hparams.split_seed)
        start = torch.randint(0, VOCABULARY, (SEQUENCES, 1), generator=generator)
        sequences = (start + torch.arange(LENGTH)) % VOCABULARY
        noise = torch.rand(sequences.shape, generator=generator) < 0.05
        random = torch.randint(0, VOCABULARY, sequences.shape, generator=generator)
        sequences = torch.where(noise, random, sequences)
        pairs = TensorDataset(sequences[:, :-1], sequences[:, 1:])  # (inputs, target)
        return split_dataset(pairs, split_sizes(SEQUENCES, 0.15, 0.15), self.hparams.split_seed)
