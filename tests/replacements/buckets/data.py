"""Sets of 2-D points, 5 to 60 each, drawn on a circle or along a line segment: which is it?

Each set is a (size, 2) tensor, generated in memory from a seed. Training batches are
buckets of sets of similar size under a budget of points (`BucketBatchSampler`), so that
little of a batch is padding and the number of sets varies from batch to batch; `collate`
pads a batch to its longest set and returns a `PointBatch`.
"""

import itertools
import math
from collections.abc import Iterator, Sequence, Sized
from typing import NamedTuple, cast

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from .kit.data import ResumableLoader, SplitDataModule, split_dataset, split_sizes

CLASSES = ("circle", "segment")
NUM_SETS = 1500
MIN_POINTS, MAX_POINTS = 5, 60
NOISE = 0.05


class PointBatch(NamedTuple):
    """A padded batch of sets."""

    points: torch.Tensor
    """(sets, longest, 2): each set's points, zeros past its end."""
    mask: torch.Tensor
    """(sets, longest): True where a point is."""
    label: torch.Tensor
    """(sets,): the class of each set (`CLASSES`)."""


def draw_set(kind: int, size: int, generator: torch.Generator) -> torch.Tensor:
    """`size` noisy points on a circle (kind 0) or a line segment (kind 1) of random size,
    place and angle: a (size, 2) tensor."""

    def uniform(low: float, high: float, *shape: int) -> torch.Tensor:
        return low + (high - low) * torch.rand(shape, generator=generator)

    centre = uniform(-2.0, 2.0, 2)
    if CLASSES[kind] == "circle":
        angle = uniform(0.0, 2 * math.pi, size)
        points = uniform(0.5, 1.5, 1) * torch.stack([angle.cos(), angle.sin()], dim=1)
    else:
        direction = uniform(0.0, math.pi, 1)
        along = uniform(-1.0, 1.0, size) * uniform(1.0, 3.0, 1)
        points = along[:, None] * torch.cat([direction.cos(), direction.sin()])[None, :]
    return centre + points + NOISE * torch.randn(size, 2, generator=generator)


def make_sets(count: int, seed: int = 0) -> tuple[list[torch.Tensor], list[int]]:
    """`count` sets of `MIN_POINTS` to `MAX_POINTS` points, classes alternating, and their
    classes: the same for the same seed."""
    generator = torch.Generator().manual_seed(seed)
    sets, labels = [], []
    for index in range(count):
        size = int(torch.randint(MIN_POINTS, MAX_POINTS + 1, (), generator=generator))
        kind = index % len(CLASSES)
        sets.append(draw_set(kind, size, generator))
        labels.append(kind)
    return sets, labels


class PointSets(Dataset):
    """(points, class) per set: a (size, 2) float tensor and an int.

    Every set's points lie in one tensor, a set a slice of it (`offsets`): a list of a
    tensor a set would be handed to each loader worker a tensor at a time, which a
    worker started by a fork server (Python 3.14's default on Linux) cannot take.
    """

    in_memory = True  # every set is a tensor already: no loader workers needed (kit.data)

    def __init__(self, sets: list[torch.Tensor], labels: list[int]):
        self.points = torch.cat(sets)
        self.offsets = list(itertools.accumulate((len(points) for points in sets), initial=0))
        self.labels = list(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.points[self.offsets[index] : self.offsets[index + 1]], self.labels[index]


def collate(samples: list[tuple[torch.Tensor, int]]) -> PointBatch:
    """Pad sets to the longest of the batch."""
    longest = max(len(points) for points, _ in samples)
    points = torch.zeros(len(samples), longest, 2)
    mask = torch.zeros(len(samples), longest, dtype=torch.bool)
    for row, (set_points, _) in enumerate(samples):
        points[row, : len(set_points)] = set_points
        mask[row, : len(set_points)] = True
    return PointBatch(points, mask, torch.tensor([label for _, label in samples]))


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of sets of similar size, each at most `max_points` points once padded
    (sets x the longest set), in a new order each epoch.

    Each epoch, the sets are sorted by size, those of the same size in a random order,
    and cut into batches in that order; the batches are then shuffled. Every epoch has
    the same number of batches (the sizes are the same), each of other sets. The order
    comes from `seed` and the epoch alone (`set_epoch`, which Lightning calls).
    """

    def __init__(
        self,
        sizes: Sequence[int],
        max_points: int = 512,
        shuffle: bool = True,
        seed: int = 0,
    ):
        if max(sizes) > max_points:
            raise ValueError(f"max_points={max_points}: a set of {max(sizes)} points fits no batch")
        self.sizes = list(sizes)
        self.max_points, self.shuffle, self.seed = max_points, shuffle, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        if self.shuffle:
            ties = torch.randperm(len(self.sizes), generator=generator).tolist()
        else:
            ties = list(range(len(self.sizes)))
        order = sorted(range(len(self.sizes)), key=lambda i: (self.sizes[i], ties[i]))
        batches: list[list[int]] = [[]]
        for index in order:  # ascending sizes: the newest set is the batch's longest
            if (len(batches[-1]) + 1) * self.sizes[index] > self.max_points:
                batches.append([])
            batches[-1].append(index)
        if self.shuffle:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=generator)]
        return iter(batches)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class PointSetsDataModule(SplitDataModule):
    """1,500 sets split 70/15/15 by `split_seed`. Training batches hold at most
    `max_points` padded points (`BucketBatchSampler`, shuffled from `shuffle_seed` and the
    epoch); validation, test and predict batches hold `batch_size` sets."""

    def __init__(
        self,
        max_points: int = 512,
        shuffle_seed: int = 0,
        data_seed: int = 0,
        **kwargs,  # SplitDataModule's: batch_size, num_workers, split_seed, ...
    ):
        super().__init__(**kwargs)

    def make_splits(self) -> dict[str, Dataset]:
        sets, labels = make_sets(NUM_SETS, self.hparams.data_seed)
        sizes = split_sizes(NUM_SETS, 0.15, 0.15)
        return split_dataset(PointSets(sets, labels), sizes, self.hparams.split_seed)

    def collate_fn(self, samples: list[tuple[torch.Tensor, int]]) -> PointBatch:
        return collate(samples)

    def train_dataloader(self) -> DataLoader:
        if self.loader_settings is None:
            self.setup()
        settings = self.loader_settings
        assert settings is not None  # setup() resolved them
        train = self.splits["train"]
        sampler = BucketBatchSampler(
            [len(train[index][0]) for index in range(len(cast(Sized, train)))],
            self.hparams.max_points,
            seed=self.hparams.shuffle_seed,
        )
        # The kit's drop-in DataLoader: a run stopped mid-epoch resumes at the next batch,
        # and under DDP each process takes its own batches of the sampler's.
        return ResumableLoader(
            train,
            batch_sampler=sampler,
            collate_fn=self.collate_fn,
            num_workers=settings.num_workers,
            pin_memory=settings.pin_memory,
            persistent_workers=settings.persistent_workers,
        )
