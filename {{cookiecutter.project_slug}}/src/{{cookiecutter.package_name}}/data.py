{%- if cookiecutter.example == "digits" -%}
"""The data: scikit-learn's handwritten digits, in memory or read from files.

Yours to replace. `SplitDataModule` (the kit) gives batch size, loader workers,
pinned memory and a predict split; return your own datasets from `make_splits()`
(any `Dataset`), or write any other LightningDataModule.
"""

import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from {{ cookiecutter.package_name }}.kit.data import SplitDataModule, split_dataset, split_sizes

NUM_SAMPLES = 1797


def load_digit_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(images, labels): uint8 pixels 0..16 of shape (1797, 8, 8), and the classes 0..9."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    return digits.images.astype(np.uint8), digits.target.astype(np.int64)


def write_digit_files(folder: Path) -> None:
    """Write every digit once as `<index>_<label>.npy`; a finished folder is left as it is.

    The files go to a temporary folder that is renamed into place, so a run that
    is killed half-way, or two runs at once, never see a partial folder.
    """
    if folder.is_dir():
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    images, labels = load_digit_arrays()
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    for index, (image, label) in enumerate(zip(images, labels, strict=True)):
        np.save(staging / f"{index:04d}_{label}.npy", image)
    try:
        os.rename(staging, folder)
    except OSError:  # another run finished first
        for file in staging.iterdir():
            file.unlink()
        staging.rmdir()


class DigitFiles(Dataset):
    """One digit per file, read and decoded in `__getitem__`, as images on disk would be."""

    def __init__(self, folder: Path):
        self.files = sorted(Path(folder).glob("*.npy"))
        if len(self.files) != NUM_SAMPLES:
            raise FileNotFoundError(f"{folder}: expected {NUM_SAMPLES} .npy files")

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path = self.files[index]
        image = torch.from_numpy(np.load(path).astype(np.float32)).unsqueeze(0)
        return image, int(path.stem.split("_")[1])


class DigitsDataModule(SplitDataModule):
    """scikit-learn's handwritten digits: 1,797 8x8 images of 10 classes, no download.

    Images are raw pixel values (0..16) in float32, shape (1, 8, 8); the model
    normalises them. The split is 70/15/15, fixed by `split_seed`. With
    `from_files`, the digits are written once to `data_dir` as one file each and
    read per item, so loader workers have work to do.
    """

    def __init__(
        self,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        from_files: bool = False,
        data_dir: str = "data/digits",
        **kwargs,  # SplitDataModule's: batch_size, num_workers, split_seed, ... (--help lists them)
    ):
        super().__init__(**kwargs)
        self.sizes = split_sizes(NUM_SAMPLES, val_fraction, test_fraction)

    def prepare_data(self) -> None:
        # Once per node, on its first process, before any `setup`.
        if self.hparams.from_files:
            write_digit_files(Path(self.hparams.data_dir))

    def make_splits(self) -> dict[str, Dataset]:
        if self.hparams.from_files:
            self.prepare_data()  # a no-op once written; here for use outside a Trainer
            dataset = DigitFiles(Path(self.hparams.data_dir))
        else:
            images, labels = load_digit_arrays()
            pixels = torch.tensor(images, dtype=torch.float32).unsqueeze(1)
            dataset = TensorDataset(pixels, torch.tensor(labels))
        return split_dataset(dataset, self.sizes, self.hparams.split_seed)
{%- else -%}
"""The data: a toy regression set, `y = x @ w + noise`, made from a seed.

Yours to replace. `SplitDataModule` (the kit) gives batch size, loader workers,
pinned memory and a predict split; return your own datasets from `make_splits()`
(any `Dataset`), or write any other LightningDataModule.
"""

import torch
from torch.utils.data import Dataset, TensorDataset

from {{ cookiecutter.package_name }}.kit.data import SplitDataModule, split_dataset, split_sizes


class SyntheticRegressionDataModule(SplitDataModule):
    """`y = x @ w + noise` with 16 features, made from `split_seed`; split 70/15/15."""

    def __init__(
        self,
        num_samples: int = 4096,
        in_features: int = 16,
        noise: float = 0.1,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        **kwargs,  # SplitDataModule's: batch_size, num_workers, split_seed, ... (--help lists them)
    ):
        super().__init__(**kwargs)
        self.sizes = split_sizes(num_samples, val_fraction, test_fraction)

    def make_splits(self) -> dict[str, Dataset]:
        h = self.hparams
        generator = torch.Generator().manual_seed(h.split_seed)
        x = torch.randn(h.num_samples, h.in_features, generator=generator)
        # Scaled so the target has unit variance: val/loss starts near 1 and
        # falls towards the noise floor, noise**2.
        w = torch.randn(h.in_features, 1, generator=generator) / h.in_features**0.5
        y = x @ w + h.noise * torch.randn(h.num_samples, 1, generator=generator)
        return split_dataset(TensorDataset(x, y), self.sizes, h.split_seed)
{%- endif %}
