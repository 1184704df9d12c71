"""Four features and a price per row of a CSV file, read into memory."""

import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from my_lightning_project.kit.data import SplitDataModule, split_dataset, split_sizes

ROWS = 1000


def write_csv(path: Path, seed: int = 0) -> None:
    if path.is_file():
        return
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(ROWS, 4))
    price = 3 * x[:, 0] - 2 * x[:, 1] + x[:, 2] * x[:, 3] + 0.1 * rng.normal(size=ROWS)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A file of its own, renamed into place: runs started together never see half of it.
    handle, partial = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(handle, "w") as file:
        np.savetxt(file, np.column_stack([x, price]), delimiter=",", header="a,b,c,d,price")
    os.replace(partial, path)


class HousesDataModule(SplitDataModule):
    def __init__(
        self,
        batch_size: int = 64,
        num_workers: int | None = None,
        pin_memory: bool | None = None,
        split_seed: int = 42,
        predict_split: str = "test",
        csv: str = "data/houses.csv",
    ):
        super().__init__(batch_size, num_workers, pin_memory, split_seed, predict_split)

    def prepare_data(self) -> None:
        write_csv(Path(self.hparams.csv))

    def make_splits(self) -> dict[str, Dataset]:
        self.prepare_data()
        table = torch.tensor(np.loadtxt(self.hparams.csv, delimiter=","), dtype=torch.float32)
        dataset = TensorDataset(table[:, :4], table[:, 4])
        return split_dataset(dataset, split_sizes(ROWS, 0.15, 0.15), self.hparams.split_seed)
