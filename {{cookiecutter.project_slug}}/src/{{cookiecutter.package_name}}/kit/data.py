"""Loader settings from the machine, and a DataModule built from named splits.

Loader settings: worker processes so the accelerator never
waits on Python, pinned memory when batches go to a CUDA device, and workers
kept alive between epochs. `SplitDataModule` resolves each one at `setup` from
the machine and the Trainer unless you set it (`--data.num_workers 4`,
`--data.pin_memory false`). Splits that are tensors in memory are sliced a
whole batch at a time (no per-sample `__getitem__`, no collate) and, on a CUDA
device they fit on, kept there: each epoch's order goes to the device once, and
every batch is a slice of it there, with no copy and no wait per batch. Using
it is optional: the rest of the kit reads what it needs from the DataLoaders of
any LightningDataModule.
"""

import inspect
import itertools
import multiprocessing
import multiprocessing.connection
import os
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from dataclasses import dataclass
from typing import Any, cast

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import (
    BatchSampler,
    ConcatDataset,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    Subset,
    TensorDataset,
    default_collate,
    random_split,
)

from .draws import (
    EpochStream,
    KeyedBatch,
    SeededSamples,
    StreamCollate,
    StreamEpoch,
    global_generators_kept,
    mix,
    seed_global_generators,
)

MAX_WORKERS = 8


@dataclass(frozen=True)
class LoaderSettings:
    num_workers: int
    pin_memory: bool
    persistent_workers: bool


def available_cpus() -> int:
    """CPUs this process may run on (honours taskset and container limits). (Lightning's
    `suggested_max_num_workers` gives a rank one worker even with one CPU to itself, where
    the worker only takes the CPU from the rank; its count of CPUs is private.)"""
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
    rank's own process, at most `MAX_WORKERS`; none for data already in memory,
    where a worker does no loading and only adds copies between processes.
    Pinned memory only pays off for copies to a CUDA device. Persistent workers
    whenever there are workers, so they are not restarted every epoch.
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


class TensorBatches(TensorDataset):
    """Tensors indexed a batch at a time.

    Given to a plain DataLoader, `__getitems__` receives the indices of a whole
    batch and returns it as one slice of each tensor: no per-sample indexing, no
    collate. `SlicedLoader` goes further and never indexes from a Python list.
    The tensors may live on the GPU.
    """

    in_memory = True

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        # A list, as the default collate makes of a TensorDataset's samples.
        index = torch.as_tensor(indices, device=self.tensors[0].device)
        return [tensor[index] for tensor in self.tensors]

    def batches(self, order: torch.Tensor, sizes: list[int]):
        """The batches of one epoch: consecutive slices of `order` (on the tensors' device)."""
        for index in order.split(sizes):
            yield [tensor[index] for tensor in self.tensors]


def _as_sliced(batch):
    return batch


class WorkersDieWithTheirProcess:
    """A DataLoader's `worker_init_fn` that ends each worker as soon as the process that
    reads it dies, then calls the user's own `then`.

    A worker outlives a SIGKILLed training process: forked, until torch's watchdog
    notices, seconds later; started by a fork server (Python 3.14's default on
    Linux), for good, since the server waits for every worker to end first. Each
    worker here waits on its parent's sentinel in a thread of its own.
    """

    def __init__(self, then: Callable[[int], Any] | None = None) -> None:
        self.then = then

    def __call__(self, worker_id: int) -> None:
        import threading

        parent = multiprocessing.parent_process()
        if parent is not None:
            threading.Thread(target=_end_with, args=(parent.sentinel,), daemon=True).start()
        if self.then is not None:
            self.then(worker_id)


def _end_with(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])  # ready once the parent is gone
    os._exit(1)


def process_rank() -> tuple[int, int]:
    """(rank, world size) in torch.distributed's default group; (0, 1) outside one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class _Skipping:
    """A loader's (batch) sampler whose iteration skips the loader's `_skip` first items,
    and gives each batch its key when the loader seeds its samples.

    One object per loader, asked for its indices at each iteration: torch's
    iterators keep the index sampler they were made with (persistent workers
    reuse theirs every epoch), so the skip and the epoch are read when the epoch starts.
    """

    def __init__(self, loader: "ResumableLoader") -> None:
        # Weakly: the loader's iterator holds this object, and a loader held back by its
        # own iterator is freed by the garbage collector, whose order leaves persistent
        # workers 5 s each to find out they are done.
        self.loader = weakref.proxy(loader)

    def _sampler(self) -> Any:
        return DataLoader._index_sampler.fget(self.loader)

    def __iter__(self):
        loader = self.loader
        sampler = self._sampler()
        if isinstance(sampler, RankBatches):
            # A batch sampler of yours that shuffles with the global generators (a bucket
            # sampler's random.shuffle): its epoch drawn from (seed, epoch) alone, the same
            # on every rank and in a resumed epoch, the process's own draws put back.
            with global_generators_kept(True):
                seed_global_generators(mix(loader.seed, loader.epoch, 6))
                sampler = list(sampler)
        batches = itertools.islice(iter(sampler), loader._skip, None)
        if not isinstance(loader.dataset, SeededSamples):
            return batches
        # Under DDP each rank's batch of a number is another: its number counts them all.
        ranks = getattr(loader.sampler, "num_replicas", 1)
        rank = getattr(loader.sampler, "rank", 0)
        key = mix(loader.seed, loader.epoch)
        return (
            KeyedBatch(batch, key, number * ranks + rank)
            for number, batch in enumerate(batches, loader._skip)
        )

    def __len__(self) -> int:
        return max(0, len(self._sampler()) - self.loader._skip)


class GlobalOrder(DistributedSampler):
    """A training order that is the same on any number of processes.

    Each epoch's order is one permutation of the dataset (from the loader's
    generator, seeded by its seed and the epoch), cut into batches of
    `batch_size`: rank r of W takes batches r, r + W, r + 2W, ... So an optimizer
    step, W x `accumulate` consecutive batches, trains the same samples on 2
    processes as on 1 accumulating twice as many. An epoch trains whole steps:
    the order's last samples that do not fill one (fewer than a step's; a
    different few each epoch) are left out, as `drop_last` leaves out a batch.
    (Data smaller than one step is one step an epoch, each rank an equal share.)
    Lightning keeps a DistributedSampler it is given and tells it the epoch.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        accumulate: int = 1,
        shuffle: bool = True,
        generator: torch.Generator | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        here, world = process_rank()
        num_replicas = world if num_replicas is None else num_replicas
        rank = here if rank is None else rank
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle)
        self.batch_size, self.accumulate, self.generator = batch_size, accumulate, generator
        self.step_samples = batch_size * num_replicas * accumulate
        if len(dataset) < num_replicas:
            raise ValueError(
                f"{len(dataset)} training samples cannot give each of {num_replicas} processes one"
            )

    def __iter__(self) -> Iterator[int]:
        n = len(cast(Sized, self.dataset))
        if self.shuffle:
            order = torch.randperm(n, generator=self.generator)
        else:
            order = torch.arange(n)
        mine = len(self)  # this rank's samples this epoch
        if n < self.step_samples:  # one step: each rank an equal share
            return iter(order[self.rank * mine : (self.rank + 1) * mine].tolist())
        batches = order[: mine * self.num_replicas].view(-1, self.batch_size)
        return iter(batches[self.rank :: self.num_replicas].flatten().tolist())

    def __len__(self) -> int:
        n = len(cast(Sized, self.dataset))
        used = n // self.step_samples * self.step_samples or n  # under a step: all of it
        return used // self.num_replicas


class RankBatches(DistributedSampler):
    """The batches of a batch sampler of your own, dealt out to the processes.

    Rank r of W takes batches r, r + W, r + 2W, ... of each epoch; the last few
    that would not give every rank one (fewer than W) are left out, so that every
    rank takes as many steps (a batch sampler that splits itself among the processes,
    with a `num_replicas` of their number, as a DistributedSampler has, is given one
    process: its own batches are this rank's). A `DistributedSampler`, so Lightning keeps it: left
    to itself, Lightning rebuilds a batch sampler around a DistributedSampler of
    its own, passed as its first argument, which only a batch sampler that reads
    its indices from a sampler survives (one built from a list of lengths reads
    the sampler as lengths, and every rank trains the same few batches).
    `set_epoch` reaches your batch sampler (and the sampler it holds, if any).
    """

    def __init__(
        self,
        batches: Iterable[Sequence[Any]],
        num_replicas: int = 1,
        rank: int = 0,
        deal: bool = True,
    ):
        # Not DistributedSampler.__init__: it deals out samples of a dataset, not batches.
        self.batches, self.num_replicas, self.rank, self.epoch = batches, num_replicas, rank, 0
        self.deal = deal  # False: the batch sampler gives this rank's batches itself
        self.shuffle, self.seed, self.drop_last = False, 0, True

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        for told in (self.batches, getattr(self.batches, "sampler", None)):
            set_epoch = getattr(told, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        if self.num_replicas == 1 or not self.deal:
            return iter(self.batches)
        every = list(self.batches)
        dealt = len(every) // self.num_replicas * self.num_replicas
        return iter(every[self.rank : dealt : self.num_replicas])

    def __len__(self) -> int:
        return len(cast(Sized, self.batches)) // (self.num_replicas if self.deal else 1)


def is_yours(batches: Any) -> bool:
    """Whether `batches` is a batch sampler of your own: not torch's plain BatchSampler
    (which Lightning rebuilds around its DistributedSampler, rightly), nor one that
    Lightning (its predictions' index keeper) or the kit wrapped."""
    if batches is None or type(batches) is BatchSampler or isinstance(batches, RankBatches):
        return False
    return not type(batches).__module__.startswith("lightning.")


class ResumableLoader(DataLoader):
    """A DataLoader that a checkpoint taken mid-epoch resumes exactly: the same
    order, from the next batch, the same random augmentation. A drop-in for
    `torch.utils.data.DataLoader`, for any dataset and sampler.

    Each epoch's order and the workers' seeds come from a generator of the
    loader's own, seeded from (`seed`, epoch): not from the global random state,
    which the model's own randomness moves. `seed` defaults to torch's initial
    seed (`seed_everything`'s). Shuffled, the order is `GlobalOrder`'s: the same
    samples in each optimizer step on any number of processes (`accumulate`: the
    Trainer's accumulate_grad_batches, so that an epoch ends on a whole step).
    The kit's `ResumeState` saves the seed, the epoch and the batches of it all
    ranks trained; `resume_at` gives them back, and the epoch's iteration skips
    those batches (no data is read for them), on as many ranks as there are now.
    A DistributedSampler gets the epoch before the order is drawn.

    A dataset that reads per sample is read through `SeededSamples`: what
    `__getitem__` draws from torch, NumPy or Python's `random` is seeded by (seed,
    epoch, sample index), what `collate_fn` draws by (seed, epoch, batch number),
    so a resumed run augments as the uninterrupted one did, with any number of
    workers. `seed_samples=False` leaves the draws to each process's generators.
    (Data in memory, `is_in_memory`, draws nothing and is read as it is.)

    A `batch_sampler` of your own is dealt out to the processes a batch at a
    time (`RankBatches`). An `IterableDataset` (a stream) is read through
    `EpochStream`: told its epoch (`set_epoch`, if it has one) in every process
    that reads it, its draws seeded by (seed, epoch, worker); a stream
    cannot seek, so a resumed epoch reads its first batches again and drops
    them. A stream shards itself among workers and processes, and every
    process's stream must give as many batches.

    Why not torchdata's StatefulDataLoader: it re-implements the DataLoader's
    iterators for each torch release, adds a dependency, does not cover the
    kit's device-resident `SlicedLoader`, and counts the batch Lightning has
    prefetched as trained. Here the epoch is the one Lightning gives the sampler
    (`set_epoch`), else counted, and the kit's `ResumeState` saves the batches
    trained from Lightning's own count, and gives them back with `resume_at`.
    """

    def __init__(
        self,
        dataset: Any,
        *args: Any,
        seed: int | None = None,
        seed_samples: bool = True,
        accumulate: int = 1,
        **kwargs: Any,
    ) -> None:
        given = inspect.signature(DataLoader).bind(dataset, *args, **kwargs).arguments
        if isinstance(dataset, SeededSamples):  # rebuilt from its own attributes (Lightning)
            given["dataset"], given["collate_fn"] = dataset.dataset, dataset.collate_fn
            dataset = dataset.dataset
        if isinstance(dataset, EpochStream):
            given["dataset"] = dataset = dataset.dataset
        if isinstance(given.get("collate_fn"), StreamCollate):
            given["collate_fn"] = given["collate_fn"].collate
        rank, self.world = process_rank()
        if isinstance(dataset, IterableDataset):
            given["dataset"] = stream = EpochStream(dataset, seeded=seed_samples)
            if seed_samples and given.get("batch_size", 1) is not None:
                collate = given.get("collate_fn") or default_collate
                given["collate_fn"] = StreamCollate(collate, stream.position)
        elif (
            seed_samples
            and given.get("batch_size", 1) is not None  # batches, not one sample at a time
            and not is_in_memory(dataset)
        ):
            collate = given.get("collate_fn") or default_collate
            given["dataset"], given["collate_fn"] = SeededSamples(dataset, collate), _as_sliced
        batches = given.get("batch_sampler")
        if batches is not None and is_yours(batches):
            # One that splits itself among the processes (it says how many) is left to it.
            splits_itself = getattr(batches, "num_replicas", 1) == self.world > 1
            given["batch_sampler"] = RankBatches(batches, self.world, rank, not splits_itself)
        # What Lightning reads as the sampler: the dealt-out batches, when they are.
        dealt = given.get("batch_sampler")
        self._dealt = dealt if isinstance(dealt, RankBatches) else None
        order = torch.Generator()
        if given.get("shuffle") and given.get("sampler") is None:
            # The order's own generator: the workers' seed is drawn from the loader's
            # only when its iterator is made, not at each epoch of persistent workers.
            size = given.get("batch_size", 1) or 1
            given["sampler"] = GlobalOrder(dataset, size, accumulate, generator=order)
            given["shuffle"] = None
        if given.get("generator") is None:
            given["generator"] = torch.Generator()
        then = given.get("worker_init_fn")
        if not isinstance(then, WorkersDieWithTheirProcess):
            given["worker_init_fn"] = WorkersDieWithTheirProcess(then)
        super().__init__(**given)
        self._order = order
        self.seed = torch.initial_seed() if seed is None else seed
        self.seed_samples, self.accumulate = seed_samples, accumulate
        self.epoch = -1  # the epoch of the current iteration
        self._resume: tuple[int, int] | None = None  # (epoch, batches to skip)
        self._told: int | None = None  # the sampler's epoch as this loader left it
        self._skip = 0

    @property
    def sampler(self) -> Any:
        """What torch and Lightning read as the sampler: `RankBatches` where a batch sampler
        of yours is dealt out; for a stream, one that Lightning tells the epoch
        (`StreamEpoch`), which torch lets no stream's loader be given."""
        return self._sampler if self._dealt is None else self._dealt

    @sampler.setter
    def sampler(self, value: Any) -> None:  # (DataLoader.__init__ sets it once)
        self._sampler = (
            StreamEpoch() if isinstance(self.__dict__.get("dataset"), EpochStream) else value
        )

    @property
    def order(self) -> str:
        """How the training order is made, which decides what a resume on another number of
        processes can keep: "global" (`GlobalOrder`: each step's samples on any number),
        "batches" (a batch sampler of yours, dealt out), "stream" (an IterableDataset,
        split by itself) or "sampler" (any other)."""
        if isinstance(self.dataset, EpochStream):
            return "stream"
        if isinstance(self.sampler, RankBatches):
            return "batches"
        return "global" if isinstance(self.sampler, GlobalOrder) else "sampler"

    @property
    def world_batch(self) -> int:
        """The samples of one batch of every rank together (batches, for a batch sampler)."""
        return (self.batch_size or 1) * (getattr(self.sampler, "num_replicas", 0) or self.world)

    def resume_at(self, seed: int, epoch: int, samples: int) -> None:
        """Start the next iteration `samples` samples (of all ranks) into `epoch`, in
        `seed`'s order: where a checkpoint stopped, on however many ranks."""
        self.seed, self._resume = seed, (epoch, samples // self.world_batch)

    def _start_epoch(self) -> int:
        """Seed this iteration's order; returns the batches of it to skip."""
        skip = 0
        told = getattr(self.sampler, "epoch", None)  # Lightning's set_epoch, each epoch
        if self._resume is not None:  # the epoch a checkpoint stopped in
            (self.epoch, skip), self._resume = self._resume, None
        elif told is not None and told != self._told:
            self.epoch = told
        else:
            self.epoch += 1
        # Distinct streams per (seed, epoch): SplitMix64's increment apart.
        stream = self.seed + self.epoch * 0x9E3779B97F4A7C15
        self._order.manual_seed(stream % 2**64)
        cast(torch.Generator, self.generator).manual_seed((stream + 1) % 2**64)  # __init__ set it
        set_epoch = getattr(self.sampler, "set_epoch", None)
        if callable(set_epoch):  # before the order is drawn (Lightning sets it after)
            set_epoch(self.epoch)
        self._told = getattr(self.sampler, "epoch", None)
        if isinstance(self.dataset, EpochStream):
            self.dataset.tell(self.seed, self.epoch)
        return skip

    @property
    def _index_sampler(self) -> Any:
        # torch's DataLoader iterators read their indices from this (private) property:
        # the one place to skip the batches a resumed epoch already trained.
        if "_skipping" not in self.__dict__:
            self._skipping = _Skipping(self)
        return self._skipping

    def __iter__(self):
        skip = self._start_epoch()
        if isinstance(self.dataset, EpochStream):  # a stream cannot seek: read, then drop
            return itertools.islice(super().__iter__(), skip, None)
        self._skip = skip
        try:
            return super().__iter__()
        finally:
            self._skip = 0

    def __len__(self) -> int:
        skip, self._skip = self._skip, 0
        try:
            return super().__len__()
        finally:
            self._skip = skip


class SlicedLoader(ResumableLoader):
    """A DataLoader of a `TensorBatches` that copies each epoch's order to the
    tensors' device once and slices every batch there.

    The order is whatever the batch sampler yields (shuffled, Lightning's
    DistributedSampler with one shard per rank and a new epoch each time, the
    index-keeping sampler of `predict`), so sharding and reshuffling are the
    DataLoader's own. A plain DataLoader would turn every batch's indices into
    a tensor on the device: a copy from host memory that makes the host wait,
    every batch.
    """

    def __iter__(self):
        dataset = self.dataset
        skip = self._start_epoch()
        batches = list(self.batch_sampler or ())[skip:]  # this epoch's, in order
        order = torch.tensor([i for batch in batches for i in batch], dtype=torch.long)
        device = dataset.tensors[0].device
        if device.type == "cuda":
            # Pinned memory lets the one copy of the epoch run without a host wait.
            order = order.pin_memory().to(device, non_blocking=True)
        else:
            order = order.to(device)
        return dataset.batches(order, [len(batch) for batch in batches])


def tensors_of(dataset: Dataset) -> tuple[torch.Tensor, ...] | None:
    """The tensors behind a TensorDataset, or a Subset of one (indexed); None otherwise."""
    if isinstance(dataset, TensorDataset):
        return dataset.tensors
    if isinstance(dataset, Subset):
        inner = tensors_of(dataset.dataset)
        if inner is not None:
            index = torch.as_tensor(dataset.indices)
            return tuple(tensor[index] for tensor in inner)
    return None


def fits_on(device: torch.device, tensors: list[torch.Tensor], share: float = 0.25) -> bool:
    """Whether `tensors` take less than `share` of the free memory of a CUDA `device`."""
    if device.type != "cuda":
        return False
    size = sum(tensor.numel() * tensor.element_size() for tensor in tensors)
    return size < share * torch.cuda.mem_get_info(device)[0]


def is_in_memory(dataset: Dataset) -> bool:
    """Whether indexing `dataset` only slices tensors already in memory.

    A dataset can say so itself with an `in_memory` attribute; tensors, and
    subsets and concatenations of in-memory datasets, are; anything else is
    taken to read or decode per item, where loader workers pay off.
    """
    declared = getattr(dataset, "in_memory", None)
    if declared is not None:
        return bool(declared)
    if isinstance(dataset, TensorDataset):
        return True
    if isinstance(dataset, Subset):
        return is_in_memory(dataset.dataset)
    if isinstance(dataset, ConcatDataset):
        return all(is_in_memory(part) for part in dataset.datasets)
    return False


def split_sizes(n: int, val_fraction: float, test_fraction: float) -> list[int]:
    """Sizes of train/val/test for `n` samples; every split gets at least one (the
    fractions `random_split` takes can leave a small split empty)."""
    if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise ValueError(
            f"val_fraction={val_fraction}, test_fraction={test_fraction}: "
            "each must be in (0, 1) and together below 1"
        )
    n_val = max(1, round(n * val_fraction))
    n_test = max(1, round(n * test_fraction))
    return [n - n_val - n_test, n_val, n_test]


def split_dataset(
    dataset: Dataset,
    sizes: Sequence[int],
    seed: int,
    names: Sequence[str] = ("train", "val", "test"),
) -> dict[str, Dataset]:
    """A fixed-seed split of any dataset (torch's `random_split`), the same on every rank
    and every run, by name."""
    total = len(cast(Sized, dataset))
    if sum(sizes) != total:
        raise ValueError(f"split sizes {list(sizes)} add up to {sum(sizes)}, not {total}")
    parts = random_split(dataset, sizes, generator=torch.Generator().manual_seed(seed))
    return {name: part for name, part in zip(names, parts, strict=True)}


def check_folds(fold: int, folds: int) -> None:
    """Refuse a fold that is not one of `folds` (and fewer than one fold), by value."""
    if folds < 1:
        raise ValueError(f"data.folds={folds}: must be 1 or more (1: the splits as they are)")
    if not 0 <= fold < folds:
        raise ValueError(
            f"data.fold={fold}: must be one of the data.folds={folds} folds, 0 to {folds - 1}"
        )


def fold_splits(splits: dict[str, Dataset], fold: int, folds: int, seed: int) -> dict[str, Dataset]:
    """Cross-validation: train and val pooled, cut into `folds` folds of the same size (within
    one sample) in an order fixed by `seed`; val is fold `fold`, train the others; every
    other split as it was. Across the folds, each sample of the pool is validated on once."""
    check_folds(fold, folds)
    if folds == 1:
        return splits
    if "train" not in splits or "val" not in splits:
        raise ValueError(
            f"data.folds={folds}: folds are cut from a 'train' and a 'val' split;"
            f" make_splits() returned {sorted(splits)}"
        )
    train, val = splits["train"], splits["val"]
    if isinstance(train, IterableDataset) or isinstance(val, IterableDataset):
        raise ValueError(
            f"data.folds={folds}: folds are cut from map-style 'train' and 'val' splits;"
            " make_splits() returned a stream (an IterableDataset): leave data.folds at 1"
        )
    if isinstance(train, Subset) and isinstance(val, Subset) and train.dataset is val.dataset:
        pool = Subset(train.dataset, [*train.indices, *val.indices])  # one dataset, sliceable
    else:
        pool = ConcatDataset([train, val])
    if folds > len(pool):
        raise ValueError(f"data.folds={folds}: more folds than train and val have samples")
    order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed)).tolist()
    bounds = [len(order) * part // folds for part in range(folds + 1)]
    held_out = order[bounds[fold] : bounds[fold + 1]]
    rest = order[: bounds[fold]] + order[bounds[fold + 1] :]

    def subset(indices: list[int]) -> Subset:
        if isinstance(pool, Subset):
            return Subset(pool.dataset, [pool.indices[index] for index in indices])
        return Subset(pool, indices)

    return {**splits, "train": subset(rest), "val": subset(held_out)}


class SplitDataModule(LightningDataModule):
    """A LightningDataModule made of named splits, with loader settings from the machine.

    Subclasses return `{"train": ..., "val": ..., "test": ...}` from
    `make_splits()`; any `Dataset` works, a stream (an `IterableDataset`) too:
    it is read in its own order, told its epoch (`ResumableLoader`). Define a
    `collate_fn(self, samples)` method to batch samples your own way (padding,
    dicts). `predict` reads the
    split named by `predict_split`. With `on_device` None (the default), splits
    of tensors are sliced a batch at a time and, on a CUDA device where they take
    under a quarter of the free memory, kept there; True keeps them on the
    device whatever their size; False reads them sample by sample through the
    usual DataLoader path. With `folds` K above 1, train and val are pooled and
    cut into K folds (fixed by `split_seed`): val is fold `fold`, train the rest
    (`fold_splits`), so that K runs, one per fold, validate on every sample once.
    Random draws in a dataset's `__getitem__` are seeded per sample and epoch
    (`ResumableLoader`); `seed_samples` False leaves them to each process.

    After `setup`, a split of tensors (a TensorDataset, or a Subset of one, as
    `split_dataset` makes) is a `TensorDataset` whatever `on_device` says:
    `self.splits["train"].tensors` holds its tensors, in the split's order.
    (Unless the module batches its own way with `collate_fn`: then its splits
    are left as `make_splits` returned them.)

    Args:
        batch_size: samples per batch on each device.
        num_workers: loader worker processes; null: chosen from the data and the
            machine's CPUs (the environment report says how many).
        pin_memory: page-locked host memory for faster copies to a GPU; null: on CUDA.
        split_seed: the seed that cuts the splits (and the folds), fixed apart from
            the run's seed.
        predict_split: the split that `predict` reads.
        on_device: keep splits of tensors on the device; null: on CUDA where they
            take under a quarter of the free memory; false: read sample by sample.
        fold: with `folds` above 1, the fold that validates (0 to folds - 1).
        folds: cut train and val into this many folds; 1: the splits as they are.
        seed_samples: seed each sample's random draws by its index and the epoch, so a
            resume draws them again; false: each process's own generator.
    """

    # None, or a subclass's method `collate_fn(self, samples)` (no annotation here: a
    # type checker would take the method for a write of another type).
    collate_fn = None

    def __init__(
        self,
        batch_size: int = 64,
        num_workers: int | None = None,
        pin_memory: bool | None = None,
        split_seed: int = 42,
        predict_split: str = "test",
        on_device: bool | None = None,
        fold: int = 0,
        folds: int = 1,
        seed_samples: bool = True,
    ):
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"data.batch_size={batch_size}: must be 1 or more")
        check_folds(fold, folds)
        self.save_hyperparameters()
        # What was passed here: a subclass need not pass every one on in its own __init__.
        self._given: dict[str, Any] = dict(
            num_workers=num_workers, pin_memory=pin_memory, on_device=on_device
        )
        self._given.update(predict_split=predict_split, split_seed=split_seed, fold=fold)
        self._given.update(folds=folds, seed_samples=seed_samples)
        self.batch_size = batch_size
        # Resolved in `setup`, once the data and the Trainer are known.
        self.loader_settings: LoaderSettings | None = None
        self.splits: dict[str, Dataset] = {}

    def __getstate__(self) -> dict[str, Any]:
        # DataLoader workers started by spawn or forkserver get a pickled copy of the
        # module whose `collate_fn` they run: without the Trainer, which holds the CLI.
        return {**self.__dict__, "trainer": None}

    def setting(self, name: str) -> Any:
        """A loader setting: as the hyperparameters hold it (what the CLI set), else as
        given to this class."""
        return self.hparams.get(name, self._given[name])

    def make_splits(self) -> dict[str, Dataset]:
        raise NotImplementedError(
            f"{type(self).__name__}.make_splits() must return a dict of datasets by split name"
        )

    def setup(self, stage: str | None = None) -> None:
        if not self.splits:
            fold, folds = self.setting("fold"), self.setting("folds")
            self.splits = fold_splits(self.make_splits(), fold, folds, self.setting("split_seed"))
        trainer = self.trainer
        device = trainer.strategy.root_device if trainer else None  # None: no Trainer, the CPU
        on_cuda = device is not None and device.type == "cuda"
        on_device = self._slice_tensor_splits(device if on_cuda else None)
        self.loader_settings = resolve_loader_settings(
            self.setting("num_workers"),
            False if on_device else self.setting("pin_memory"),
            cpus=available_cpus(),
            local_world_size=trainer.num_devices if trainer else 1,
            on_cuda=on_cuda,
            in_memory=all(is_in_memory(split) for split in self.splits.values()),
        )

    def _slice_tensor_splits(self, device: torch.device | None) -> bool:
        """Turn splits of tensors into TensorBatches, moved to the CUDA `device` (None:
        none) where `on_device` says so; returns whether they were moved."""
        wanted = self.setting("on_device")
        if self.collate_fn is not None:  # the module batches its own way
            return False
        tensors = {name: tensors_of(split) for name, split in self.splits.items()}
        tensors = {name: found for name, found in tensors.items() if found is not None}
        if wanted is False:  # the same type, read sample by sample the usual way
            for name, found in tensors.items():
                self.splits[name] = TensorDataset(*found)
            return False
        everything = [tensor for found in tensors.values() for tensor in found]
        move = device is not None and (wanted or (wanted is None and fits_on(device, everything)))
        for name, found in tensors.items():
            self.splits[name] = TensorBatches(*(t.to(device) if move else t for t in found))
        return bool(move and tensors)

    def loader(self, split: str, shuffle: bool = False) -> DataLoader:
        """The DataLoader of one split, with the resolved settings."""
        if self.loader_settings is None:
            self.setup()
        if split not in self.splits:
            raise KeyError(
                f"no {split!r} split: {type(self).__name__}.make_splits() returned "
                f"{sorted(self.splits)}"
            )
        settings = self.loader_settings
        assert settings is not None  # setup() resolved them
        dataset = self.splits[split]
        shuffle = shuffle and not isinstance(dataset, IterableDataset)  # a stream orders itself
        # A shuffled (training) order ends each epoch on a whole optimizer step.
        trainer = self.trainer
        accumulate = trainer.accumulate_grad_batches if shuffle and trainer else 1
        sliced = isinstance(dataset, TensorBatches)
        copied = settings.pin_memory and dataset.tensors[0].device.type == "cpu"
        if sliced and not copied and not self.setting("num_workers"):
            # The tensors are where the steps run: slice there, in this process.
            return SlicedLoader(
                dataset, batch_size=self.batch_size, shuffle=shuffle, accumulate=accumulate
            )
        # Read per sample, or batches of host tensors copied to a GPU from pinned memory.
        return ResumableLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=settings.num_workers,
            pin_memory=settings.pin_memory,
            persistent_workers=settings.persistent_workers,
            collate_fn=_as_sliced if sliced else self.collate_fn,
            seed_samples=self.setting("seed_samples"),
            accumulate=accumulate,
        )

    def train_dataloader(self) -> DataLoader:
        # Each rank takes its own batches of one global order (`GlobalOrder`), new
        # each epoch: Lightning keeps that sampler and sets its epoch every epoch.
        return self.loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader("val")

    def test_dataloader(self) -> DataLoader:
        return self.loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self.loader(self.setting("predict_split"))
