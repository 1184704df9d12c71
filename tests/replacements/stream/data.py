"""A long noisy signal of three frequencies, stored as shard files and streamed in windows.

`prepare_data` writes the signal once to `data_dir`: `NUM_SHARDS` training shards, then a
validation and a test shard, each a `.npy` file of `SHARD_LENGTH` values (staged in a
folder of their own, renamed into place). Training streams windows from the shards (an
`IterableDataset`): each reader, a loader worker of a DDP rank, reads its own shards, in an
order and from window offsets reshuffled every epoch from a seed and the epoch
(`set_epoch`). Validation and test are every window of their shard, held in memory.
"""

import math
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, TensorDataset, get_worker_info

from .kit.data import SplitDataModule

NUM_SHARDS = 8  # training shards: 1, 2, 4 or 8 DDP ranks each stream as many windows
SHARD_LENGTH = 544
WINDOW = 32  # the values the model sees; it predicts the one after them
STRIDE = 4  # between the starts of training windows
PER_SHARD = (SHARD_LENGTH - WINDOW - STRIDE) // STRIDE + 1  # 128: two batches of 64
PERIODS = (11.0, 29.0, 67.0)  # in samples
AMPLITUDES = (1.0, 0.6, 0.8)
NOISE = 0.1


def make_signal(length: int, seed: int = 0) -> np.ndarray:
    """`length` values of three sines of random phase, plus Gaussian noise of std `NOISE`."""
    rng = np.random.default_rng(seed)
    t = np.arange(length)
    phases = rng.uniform(0, 2 * math.pi, len(PERIODS))
    clean = sum(
        amplitude * np.sin(2 * math.pi * t / period + phase)
        for amplitude, period, phase in zip(AMPLITUDES, PERIODS, phases, strict=True)
    )
    return (clean + NOISE * rng.normal(size=length)).astype(np.float32)


def shard_names() -> list[str]:
    """The files of the signal, in its order: the training shards, then val, then test."""
    return [f"train-{index:02d}.npy" for index in range(NUM_SHARDS)] + ["val.npy", "test.npy"]


def write_shards(folder: Path, seed: int = 0) -> None:
    """Cut one signal into the shard files, written once to a folder of their own."""
    if folder.is_dir():
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    names = shard_names()
    pieces = np.split(make_signal(SHARD_LENGTH * len(names), seed), len(names))
    for name, piece in zip(names, pieces, strict=True):
        np.save(staging / name, piece)
    try:
        staging.rename(folder)
    except OSError:  # another run finished first
        shutil.rmtree(staging)


def rank_and_world() -> tuple[int, int]:
    """This process's DDP rank and the number of ranks (0 and 1 outside DDP)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class SignalStream(IterableDataset):
    """(window, next value) pairs streamed from shard files: a 1 x `WINDOW` float tensor and
    a scalar.

    Reader `rank * num_workers + worker_id` (of `world_size * num_workers`) reads its own
    shards: the epoch's shard order is dealt to the ranks, every `world_size`-th shard
    to each, and a rank's shards to its loader workers the same way. Every rank streams
    as many windows, however many workers it has. Within a shard, windows start every
    `STRIDE` values from an offset below `STRIDE`, in a shuffled order. The shard order,
    the offsets and the window orders are drawn from (`seed`, epoch, shard), the epoch
    `set_epoch` gave it (the kit tells it in every process that reads it). The rank is
    taken when the stream is made (in the DataModule's setup, once the processes are
    set up): a loader worker started by a fork server has no process group to ask.
    """

    def __init__(self, files: list[Path], seed: int = 0):
        if not files:
            raise FileNotFoundError("no training shards")
        self.files, self.seed, self.epoch = files, seed, 0
        self.rank, self.world = rank_and_world()
        if len(files) % self.world:
            raise ValueError(
                f"{len(files)} shards cannot be shared evenly by {self.world} ranks: they "
                "would stream different numbers of batches"
            )

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for `epoch` at the next iteration."""
        self.epoch = epoch

    def __len__(self) -> int:
        """The windows this rank streams in an epoch (all its loader workers together)."""
        return len(self.files) // self.world * PER_SHARD

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch = self.epoch
        order = np.random.default_rng((self.seed, epoch)).permutation(len(self.files))
        for shard in order[self.rank :: self.world][worker::workers]:
            values = torch.from_numpy(np.load(self.files[shard]))
            rng = np.random.default_rng((self.seed, epoch, int(shard)))
            offset = int(rng.integers(STRIDE))
            starts = offset + STRIDE * rng.permutation(PER_SHARD)
            for start in starts.tolist():
                yield values[start : start + WINDOW].unsqueeze(0), values[start + WINDOW]


def every_window(path: Path) -> TensorDataset:
    """Every window of one shard and the value after it, as tensors."""
    values = torch.from_numpy(np.load(path))
    windows = values.unfold(0, WINDOW, 1)[: len(values) - WINDOW]
    return TensorDataset(windows.unsqueeze(1).contiguous(), values[WINDOW:].clone())


class SignalDataModule(SplitDataModule):
    """The signal's shards: training streamed (`SignalStream`), val and test in memory.

    `stream_seed` fixes the training stream's order, which changes every epoch.
    """

    def __init__(self, data_dir: str = "data/signal", stream_seed: int = 0, **kwargs):
        super().__init__(**kwargs)

    def prepare_data(self) -> None:
        write_shards(Path(self.hparams.data_dir))

    def make_splits(self) -> dict[str, Dataset]:
        self.prepare_data()  # a no-op once written; here for use outside a Trainer
        folder = Path(self.hparams.data_dir)
        shards = [folder / name for name in shard_names()[:NUM_SHARDS]]
        return {
            "train": SignalStream(shards, self.hparams.stream_seed),
            "val": every_window(folder / "val.npy"),
            "test": every_window(folder / "test.npy"),
        }
