"""Random draws of the training data, keyed by where they happen, not by who reads it.

A dataset's `__getitem__` that flips or crops at random, and a stream that
shuffles its shards, draw from torch's, NumPy's and Python's global generators.
Read by loader workers, those draws would depend on how many workers there are
and on where a run was resumed. Here they are seeded from (seed, epoch, sample)
for a map-style dataset (`SeededSamples`) and from (seed, epoch, worker) for
an iterable one (`EpochStream`), so that a resumed run reads what the
uninterrupted one read. In the training process itself (no workers) the
generators are put back after each read: the model's own draws (dropout) do not
depend on the data it read. Imports only torch and NumPy.
"""

import itertools
import operator
import random
from collections.abc import Callable, Generator, Iterator, Sequence, Sized
from contextlib import contextmanager
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info

_MASK = 2**64 - 1


def mix(*parts: int) -> int:
    """One 64-bit seed from integers, each folded in with SplitMix64's finaliser:
    nearby inputs ((seed, epoch, 7) and (seed, epoch, 8)) give unrelated seeds."""
    key = 0
    for part in parts:
        key = (key ^ part) + 0x9E3779B97F4A7C15 & _MASK
        key = (key ^ (key >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
        key = (key ^ (key >> 27)) * 0x94D049BB133111EB & _MASK
        key ^= key >> 31
    return key


def seed_global_generators(key: int) -> None:
    """Seed the generators a `__getitem__` or a `collate_fn` draws from: torch's (on the
    CPU; a device's own generator is the model's), NumPy's and Python's."""
    torch.default_generator.manual_seed(key)
    np.random.seed(key >> 32)
    random.seed(key)


@contextmanager
def global_generators_kept(keep: bool) -> Generator[None]:
    """With `keep`, the global generators' states are as they were after the block: the
    training process's own draws (dropout) do not depend on the data it read."""
    if not keep:
        yield
        return
    states = torch.default_generator.get_state(), np.random.get_state(), random.getstate()
    try:
        yield
    finally:
        torch.default_generator.set_state(states[0])
        np.random.set_state(states[1])
        random.setstate(states[2])


class KeyedBatch(list):
    """A batch's sample indices, with the key its random draws are seeded from: the
    loader's seed and the epoch (`key`), and the batch's number in the epoch."""

    def __init__(self, indices: Sequence[int], key: int, number: int) -> None:
        super().__init__(indices)
        self.key, self.number = key, number


class SeededSamples(Dataset):
    """A map-style dataset whose samples draw the same random numbers wherever they are read.

    Before each sample of a `KeyedBatch` is read, torch's, NumPy's and Python's
    global generators are seeded from (seed, epoch, sample index); before the
    batch is collated, from (seed, epoch, batch number). So a random flip or crop
    in `__getitem__` (as torchvision's transforms draw them) depends on the
    sample and the epoch alone: not on the worker that reads it, how many
    workers there are, or where a run was resumed. In the training process
    (no workers) the generators are put back after each batch. Anything else is
    the wrapped dataset's: its attributes, its length, `self.dataset`.
    """

    def __init__(self, dataset: Dataset, collate_fn: Callable[[list[Any]], Any]) -> None:
        self.dataset, self.collate_fn = dataset, collate_fn

    def __len__(self) -> int:
        return len(cast(Sized, self.dataset))

    def __getitem__(self, index: Any) -> Any:
        return self.dataset[index]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("dataset", "collate_fn"):  # unpickling
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitems__(self, batch: Sequence[Any]) -> Any:
        key, number = getattr(batch, "key", None), getattr(batch, "number", 0)
        if key is None:  # indices from elsewhere: read as a DataLoader would
            return self.collate_fn([self.dataset[index] for index in batch])
        with global_generators_kept(get_worker_info() is None):
            read_whole = getattr(self.dataset, "__getitems__", None)
            if read_whole:  # the dataset reads a batch at once: seeded by the batch
                seed_global_generators(mix(key, 1, number))
                samples = read_whole(list(batch))
            else:
                samples = []
                for position, index in enumerate(batch):
                    try:
                        where = (0, operator.index(index))
                    except TypeError:  # a sampler's own keys, not numbers: the sample's place
                        where = (3, number, position)
                    seed_global_generators(mix(key, *where))
                    samples.append(self.dataset[index])
            seed_global_generators(mix(key, 2, number))
            return self.collate_fn(samples)


def generator_states() -> tuple[Any, Any, Any]:
    """torch's (CPU), NumPy's and Python's global generator states."""
    return torch.default_generator.get_state(), np.random.get_state(), random.getstate()


def set_generator_states(states: tuple[Any, Any, Any]) -> None:
    torch.default_generator.set_state(states[0])
    np.random.set_state(states[1])
    random.setstate(states[2])


def drawn_apart(start: Callable[[], Iterator[Any]], key: int) -> Iterator[Any]:
    """The items of `start()`, started and read with global generators of their own, seeded
    from `key`: around every read the process's generators are as they were, so that what
    the items draw and what the process draws between them (a model's dropout) do not
    depend on each other."""
    theirs = generator_states()
    seed_global_generators(key)
    try:
        iterator = start()
    finally:
        ours = generator_states()
        set_generator_states(theirs)
    while True:
        theirs = generator_states()
        set_generator_states(ours)
        try:
            item = next(iterator)
        except StopIteration:
            return
        finally:
            ours = generator_states()
            set_generator_states(theirs)
        yield item


class EpochStream(IterableDataset):
    """An iterable dataset (a stream) as a `ResumableLoader` reads it: told its epoch, and
    drawing random numbers of its own.

    At the start of each epoch, in whichever process reads the stream (each loader
    worker, persistent ones too, or the training process), the stream's
    `set_epoch(epoch)` is called where it defines one, and the global generators
    are seeded from (seed, epoch, worker). The seed and the epoch reach the
    workers through `position`, a tensor in shared memory that the loader sets
    before each epoch (`tell`). So a stream that shuffles its shards with
    `random.shuffle` or adds noise from NumPy reads the same samples in the same
    order in a resumed epoch as in the uninterrupted one, and a stream that orders
    itself by its epoch (`set_epoch`) is told the right one, never one it counted.
    The draws are the same on every process: a stream that does not split itself
    among them gives each the same batches, which `kit/shards.py` catches. With
    `seeded` False, only the epoch is told. Anything else is the wrapped
    dataset's: its attributes, its length, `self.dataset`.
    """

    def __init__(self, dataset: IterableDataset, seeded: bool = True) -> None:
        self.dataset, self.seeded = dataset, seeded
        # (seed, epoch, reading): the reading counts the times it was told, one an iteration.
        self.position = torch.zeros(3, dtype=torch.int64).share_memory_()

    def tell(self, seed: int, epoch: int) -> None:
        """The seed and the epoch of the next reading, for every process that reads it."""
        seed %= 2**64
        self.position[0] = seed - 2**64 if seed >= 2**63 else seed  # stored signed
        self.position[1] = epoch
        self.position[2] += 1

    def __len__(self) -> int:
        return len(cast(Sized, self.dataset))  # a TypeError where the stream has no length

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("dataset", "seeded", "position"):
            raise AttributeError(name)  # (unpickling)
        return getattr(self.dataset, name)

    def _start(self) -> Iterator[Any]:
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(int(self.position[1]))
        return iter(self.dataset)

    def __iter__(self) -> Iterator[Any]:
        if not self.seeded:
            return self._start()
        seed, epoch, _ = self.position.tolist()
        worker = get_worker_info()
        key = mix(seed % 2**64, epoch, 4, worker.id if worker else 0)
        if worker is None:  # the training process: its generators are put back
            return drawn_apart(self._start, key)
        seed_global_generators(key)  # a worker's process reads nothing else
        return self._start()


class StreamCollate:
    """A stream's `collate_fn`, drawing random numbers of its own in the training process.

    Read in the training process (no loader workers), a stream's batches are collated
    there: what the collate draws (a language model's masking) is seeded by (seed,
    epoch, the batch's number in the reading) and the process's generators are put
    back, so a resumed epoch masks as the uninterrupted one did, and the model's own
    draws do not move. In a worker the generators are the stream's already.
    """

    def __init__(self, collate: Callable[[list[Any]], Any], position: torch.Tensor) -> None:
        self.collate, self.position = collate, position
        self._reading: tuple[int, ...] | None = None
        self._number = 0

    def __call__(self, samples: list[Any]) -> Any:
        if get_worker_info() is not None:
            return self.collate(samples)
        reading = tuple(self.position.tolist())
        if reading != self._reading:  # a new reading: its batches count from 0
            self._reading, self._number = reading, 0
        seed, epoch, _ = reading
        with global_generators_kept(True):
            seed_global_generators(mix(seed % 2**64, epoch, 5, self._number))
            self._number += 1
            return self.collate(samples)


class StreamEpoch(Sampler):
    """The sampler a stream's loader shows Lightning: none of its own indices (a stream
    reads itself), the epoch Lightning tells it (`set_epoch`, at each epoch's start),
    which the loader then tells the stream, whatever made the loader (a DataModule that
    makes it anew each epoch too)."""

    def __init__(self) -> None:
        self.epoch: int | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[None]:
        return itertools.repeat(None)
