"""Points on a ring: 3000 2-D samples, radius 2 with a little radial noise, made in memory.

Deterministic (a seeded generator), split 80/10/10 by the kit's `split_dataset`; the
GAN learns to draw samples from the ring, so the points are the only tensor of a batch.
"""

import math

import torch
from torch.utils.data import Dataset, TensorDataset

from .kit.data import SplitDataModule, split_dataset, split_sizes

POINTS = 3000
RADIUS = 2.0
NOISE = 0.1


def ring(n: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    angle = 2 * math.pi * torch.rand(n, generator=generator)
    radius = RADIUS + NOISE * torch.randn(n, generator=generator)
    return torch.stack([radius * angle.cos(), radius * angle.sin()], dim=1)


class RingDataModule(SplitDataModule):
    # SplitDataModule's own arguments, inherited: the shipped configs set some of them.

    def make_splits(self) -> dict[str, Dataset]:
        dataset = TensorDataset(ring(POINTS))
        return split_dataset(dataset, split_sizes(POINTS, 0.1, 0.1), self.hparams.split_seed)
