"""Gaussian blobs in 20-D: eight blobs, four classes (blob b is class b % 4), in memory.

The same eight blobs give the pretraining task (model.py, `pretrain_backbone`: which blob)
and this one (which class). Validation reads two loaders: the clean samples and the same
samples with noise added (a shifted distribution); the monitored metric is the clean one.
"""

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from .kit.data import SplitDataModule, split_dataset, split_sizes

DIM = 20
BLOBS = 8
CLASSES = 4
NUM_SAMPLES = 2000
SPREAD = 1.5  # each blob's standard deviation
SHIFT = 1.0  # the standard deviation of the noise of the shifted validation samples


def blob_centres() -> torch.Tensor:
    """The eight blobs' centres, (BLOBS, DIM): the same in every task."""
    return 1.25 * torch.randn(BLOBS, DIM, generator=torch.Generator().manual_seed(1234))


def draw_blobs(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, blobs): `count` samples, blobs in turn, the same for the same seed."""
    generator = torch.Generator().manual_seed(seed)
    blobs = torch.arange(count) % BLOBS
    inputs = blob_centres()[blobs] + SPREAD * torch.randn(count, DIM, generator=generator)
    return inputs, blobs


class BlobsDataModule(SplitDataModule):
    """2,000 samples of four classes, split 70/15/15 by `split_seed`, and a shifted copy of
    the validation split (`val_shifted`: noise of standard deviation `shift`).

    `val_dataloader` returns both validation loaders, the clean one first.
    """

    def __init__(
        self,
        data_seed: int = 0,
        shift: float = SHIFT,
        **kwargs,  # SplitDataModule's: batch_size, num_workers, split_seed, ...
    ):
        super().__init__(**kwargs)

    def make_splits(self) -> dict[str, Dataset]:
        inputs, blobs = draw_blobs(NUM_SAMPLES, self.hparams.data_seed)
        dataset = TensorDataset(inputs, blobs % CLASSES)
        splits = split_dataset(
            dataset, split_sizes(NUM_SAMPLES, 0.15, 0.15), self.hparams.split_seed
        )
        val = inputs[splits["val"].indices]  # type: ignore[attr-defined]
        noise = torch.randn(val.shape, generator=torch.Generator().manual_seed(7))
        labels = blobs[splits["val"].indices] % CLASSES  # type: ignore[attr-defined]
        splits["val_shifted"] = TensorDataset(val + self.hparams.shift * noise, labels)
        return splits

    def val_dataloader(self) -> list[DataLoader]:
        # Lightning passes each batch's loader as `dataloader_idx` to validation_step.
        return [self.loader("val"), self.loader("val_shifted")]
