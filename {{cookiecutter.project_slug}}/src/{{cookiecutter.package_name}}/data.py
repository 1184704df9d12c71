"""The LightningDataModule: the data, its fixed-seed split and fast loaders.

Loader settings follow the guide: worker processes so the accelerator never
waits on Python, pinned memory when batches go to a CUDA device, and workers
kept alive between epochs. Each one is resolved at `setup` from the machine and
the Trainer unless you set it (`--data.num_workers 4`, `--data.pin_memory false`).
"""

import os
from dataclasses import dataclass

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset, TensorDataset

MAX_WORKERS = 8


@dataclass(frozen=True)
class LoaderSettings:
    num_workers: int
    pin_memory: bool
    persistent_workers: bool


def available_cpus() -> int:
    """CPUs this process may run on (honours taskset and container limits)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows
        return os.cpu_count() or 1


def resolve_loader_settings(
    num_workers: int | None,
    pin_memory: bool | None,
    *,
    cpus: int,
    local_world_size: int,
    on_cuda: bool,
    in_memory: bool = False,
) -> LoaderSettings:
    """Fill in the loader settings the user left unset.

    Workers: the CPUs of this node shared among its ranks, one left for the
    rank's own process, at most `MAX_WORKERS`; none for tensors already in
    memory, where a worker does no loading and only adds copies between
    processes. Pinned memory only pays off for copies to a CUDA device.
    Persistent workers whenever there are workers, so they are not restarted
    every epoch.
    """
    if num_workers is None and in_memory:
        num_workers = 0
    elif num_workers is None:
        per_rank = cpus // max(1, local_world_size)
        num_workers = max(0, min(MAX_WORKERS, per_rank - 1))
    if num_workers < 0:
        raise ValueError(f"data.num_workers={num_workers}: must be 0 or more")
    if pin_memory is None:
        pin_memory = on_cuda
    return LoaderSettings(num_workers, pin_memory, persistent_workers=num_workers > 0)


class TensorDataModule(LightningDataModule):
    """Shared loader logic; subclasses build the three splits in `make_splits`."""

    def __init__(
        self,
        batch_size: int = 64,
        num_workers: int | None = None,
        pin_memory: bool | None = None,
        split_seed: int = 42,
    ):
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"data.batch_size={batch_size}: must be 1 or more")
        self.save_hyperparameters()
        self.batch_size = batch_size
        # Resolved in `setup`, once the data and the Trainer are known.
        self.loader_settings: LoaderSettings | None = None
        self.splits: dict[str, Dataset] = {}

    def make_splits(self) -> dict[str, Dataset]:
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if not self.splits:
            self.splits = self.make_splits()
        trainer = self.trainer
        self.loader_settings = resolve_loader_settings(
            self.hparams.num_workers,
            self.hparams.pin_memory,
            cpus=available_cpus(),
            local_world_size=trainer.num_devices if trainer else 1,
            on_cuda=bool(trainer) and trainer.strategy.root_device.type == "cuda",
            in_memory=all(isinstance(s, TensorDataset) for s in self.splits.values()),
        )

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        s = self.loader_settings
        return DataLoader(
            self.splits[split],
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=s.num_workers,
            pin_memory=s.pin_memory,
            persistent_workers=s.persistent_workers,
        )

    def train_dataloader(self) -> DataLoader:
        # Under DDP, Lightning swaps in a DistributedSampler and sets its epoch
        # every epoch, so ranks see disjoint samples in a new order each time.
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)


def split_sizes(n: int, val_fraction: float, test_fraction: float) -> list[int]:
    """Sizes of train/val/test for `n` samples; every split gets at least one."""
    if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise ValueError(
            f"val_fraction={val_fraction}, test_fraction={test_fraction}: "
            "each must be in (0, 1) and together below 1"
        )
    n_val = max(1, round(n * val_fraction))
    n_test = max(1, round(n * test_fraction))
    return [n - n_val - n_test, n_val, n_test]


def random_split(dataset: TensorDataset, sizes: list[int], seed: int) -> dict[str, TensorDataset]:
    """A fixed-seed split, the same on every rank and every run."""
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))
    splits, start = {}, 0
    for name, size in zip(("train", "val", "test"), sizes, strict=True):
        index = order[start : start + size]
        splits[name] = TensorDataset(*(t[index] for t in dataset.tensors))
        start += size
    return splits
{% if cookiecutter.example == "digits" %}

class DigitsDataModule(TensorDataModule):
    """scikit-learn's handwritten digits: 1,797 8x8 images of 10 classes, no download.

    Images are kept as raw pixel values (0..16) in float32, shape (N, 1, 8, 8);
    the model normalises them. The split is 70/15/15, fixed by `split_seed`.
    """

    def __init__(
        self,
        batch_size: int = 64,
        num_workers: int | None = None,
        pin_memory: bool | None = None,
        split_seed: int = 42,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
    ):
        super().__init__(batch_size, num_workers, pin_memory, split_seed)
        self.sizes = split_sizes(1797, val_fraction, test_fraction)

    def make_splits(self) -> dict[str, TensorDataset]:
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1)
        labels = torch.tensor(digits.target, dtype=torch.long)
        return random_split(TensorDataset(images, labels), self.sizes, self.hparams.split_seed)
{%- else %}

class SyntheticRegressionDataModule(TensorDataModule):
    """The guide's toy data: `y = x @ w + noise` with 16 features, made from a seed."""

    def __init__(
        self,
        batch_size: int = 64,
        num_workers: int | None = None,
        pin_memory: bool | None = None,
        split_seed: int = 42,
        num_samples: int = 4096,
        in_features: int = 16,
        noise: float = 0.1,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
    ):
        super().__init__(batch_size, num_workers, pin_memory, split_seed)
        self.sizes = split_sizes(num_samples, val_fraction, test_fraction)

    def make_splits(self) -> dict[str, TensorDataset]:
        h = self.hparams
        generator = torch.Generator().manual_seed(h.split_seed)
        x = torch.randn(h.num_samples, h.in_features, generator=generator)
        # Scaled so the target has unit variance: val/loss starts near 1 and
        # falls towards the noise floor, noise**2.
        w = torch.randn(h.in_features, 1, generator=generator) / h.in_features**0.5
        y = x @ w + h.noise * torch.randn(h.num_samples, 1, generator=generator)
        return random_split(TensorDataset(x, y), self.sizes, h.split_seed)
{%- endif %}
