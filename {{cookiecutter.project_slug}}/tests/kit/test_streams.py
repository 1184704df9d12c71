"""Data of the shapes beside a map-style dataset: a stream (an IterableDataset), a batch
sampler of your own, and weights that start to train half-way, on one process and many.

Kit test of the kit's loaders and guards with small data of its own: a stream told its
epoch in every process that reads it and resumed exactly, with or without workers; a
batch sampler dealt out to the processes; a batch sampler Lightning rebuilt wrongly,
caught; a block unfrozen under DDP, trained alike on every rank.
"""

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from support import same_values
from torch import nn
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    Sampler,
    SequentialSampler,
    TensorDataset,
    get_worker_info,
)

from {{ cookiecutter.package_name }}.kit.data import (
    RankBatches,
    ResumableLoader,
    SplitDataModule,
    fold_splits,
)
from {{ cookiecutter.package_name }}.kit.draws import seed_global_generators
from {{ cookiecutter.package_name }}.kit.shards import misread_batch_sampler


class Shards(IterableDataset):
    """Eight shards of five rows, split among the loader's workers; the shards' order is
    shuffled with Python's `random` and each row carries NumPy noise, the epoch it was
    told and where it came from."""

    def __init__(self, counts_its_epochs: bool = False) -> None:
        self.epoch, self.counts = 0, counts_its_epochs

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        worker = get_worker_info()
        mine, every = (worker.id, worker.num_workers) if worker else (0, 1)
        shards = list(range(8))
        random.shuffle(shards)
        for shard in shards[mine::every]:
            for row in range(5):
                yield torch.tensor([self.epoch, shard, row, float(np.random.rand())])


def epochs_of(loader, count: int = 3) -> list[list[torch.Tensor]]:
    return [list(loader) for _ in range(count)]


@pytest.mark.parametrize(
    "workers", [0, pytest.param(2, marks=pytest.mark.slow)], ids=["in process", "2 workers"]
)
def test_a_stream_is_told_its_epoch_and_a_resume_continues_it_exactly(workers):
    persistent = dict(num_workers=workers, persistent_workers=workers > 0)
    torch.manual_seed(0)
    uninterrupted = epochs_of(ResumableLoader(Shards(), batch_size=4, **persistent))
    assert [len(epoch) for epoch in uninterrupted] == [10, 10, 10]
    # Each epoch read as its own (the workers, kept from one epoch to the next, are told).
    assert [int(epoch[0][0, 0]) for epoch in uninterrupted] == [0, 1, 2]
    assert not same_values(uninterrupted[0], uninterrupted[1])
    # A run resumed 3 batches into epoch 1: its iterator made once before the position was
    # known (as Lightning makes it), the epoch's rest, then epoch 2, as they were.
    torch.manual_seed(0)
    resumed = ResumableLoader(Shards(), batch_size=4, **persistent)
    list(resumed)
    resumed.resume_at(resumed.seed, 1, 3 * resumed.world_batch)
    assert same_values(list(resumed), uninterrupted[1][3:])
    assert same_values(list(resumed), uninterrupted[2])


def test_a_stream_read_in_process_leaves_the_process_draws_alone():
    """The stream's draws are its own: the model's (dropout, noise) come out as without it."""
    seed_global_generators(0)
    expected = torch.rand(3), np.random.rand(), random.random()
    seed_global_generators(0)
    loader = ResumableLoader(Shards(), batch_size=4)
    for _ in loader:
        pass
    assert same_values((torch.rand(3), np.random.rand(), random.random()), expected)


def masked(samples):
    """A collate that draws as it batches (a language model's masking)."""
    batch = torch.stack(samples)
    return batch * (torch.rand(len(batch), 1) > 0.5)


def test_a_streams_collate_draws_numbers_of_its_own_in_process():
    """Read in the training process, a stream's collate draws from generators seeded by the
    batch (the model's own draws untouched), and a resumed epoch masks as it did."""
    seed_global_generators(0)
    expected = torch.rand(3), np.random.rand(), random.random()
    seed_global_generators(0)
    loader = ResumableLoader(Shards(), batch_size=4, collate_fn=masked)
    uninterrupted = epochs_of(loader, 2)
    assert same_values((torch.rand(3), np.random.rand(), random.random()), expected)
    resumed = ResumableLoader(Shards(), batch_size=4, collate_fn=masked, seed=loader.seed)
    list(resumed)
    resumed.resume_at(loader.seed, 1, 2 * resumed.world_batch)
    assert same_values(list(resumed), uninterrupted[1][2:])


class EpochsSeen(LightningModule):
    """Trains on a stream whose loader its DataModule makes anew each epoch; keeps the
    epoch each batch was read in."""

    def __init__(self) -> None:
        super().__init__()
        self.layer, self.seen = nn.Linear(4, 1), []

    def train_dataloader(self) -> DataLoader:
        return ResumableLoader(Shards(), batch_size=10)

    def training_step(self, batch, batch_idx):
        self.seen.append((self.current_epoch, int(batch[0, 0])))
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_a_stream_is_told_lightnings_epoch_by_a_loader_made_anew_each_epoch():
    model = EpochsSeen()
    trainer = Trainer(
        accelerator="cpu",
        max_epochs=3,
        reload_dataloaders_every_n_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model)
    assert {epoch for epoch, _ in model.seen} == {0, 1, 2}
    assert all(told == epoch for epoch, told in model.seen)


def test_a_split_datamodule_trains_a_stream_in_its_own_order_and_cuts_no_folds():
    class Streamed(SplitDataModule):
        def make_splits(self):
            rows = TensorDataset(torch.arange(8.0).unsqueeze(1))
            return {"train": Shards(), "val": rows, "test": rows}

    datamodule = Streamed(batch_size=4, num_workers=0)
    datamodule.setup("fit")
    loader = datamodule.train_dataloader()
    assert loader.order == "stream" and len(list(loader)) == 10
    with pytest.raises(ValueError, match=r"data.folds=2: folds are cut from map-style"):
        fold_splits(datamodule.make_splits(), 0, 2, seed=0)


class LengthBuckets(Sampler):
    """A batch sampler of the usual kind: built from each sample's length (not a sampler),
    batches of samples of one length, shuffled by epoch."""

    def __init__(self, lengths, batch_size: int = 3, drop_last: bool = False) -> None:
        self.lengths, self.batch_size, self.drop_last = list(lengths), batch_size, drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        by_length: dict[int, list[int]] = {}
        for index, length in enumerate(self.lengths):
            by_length.setdefault(int(length), []).append(index)
        batches = [
            group[start : start + self.batch_size]
            for group in by_length.values()
            for start in range(0, len(group), self.batch_size)
        ]
        random.Random(self.epoch).shuffle(batches)
        return iter(batches)

    def __len__(self) -> int:
        return sum(1 for _ in self)


LENGTHS = [1 + index % 4 for index in range(40)]


def test_a_batch_sampler_of_yours_is_dealt_out_to_the_processes():
    data = TensorDataset(torch.arange(40))
    ranks = [list(RankBatches(LengthBuckets(LENGTHS), 2, rank)) for rank in (0, 1)]
    every = list(LengthBuckets(LENGTHS))
    assert len(ranks[0]) == len(ranks[1]) == len(every) // 2
    assert ranks[0] + ranks[1] and not {*map(tuple, ranks[0])} & {*map(tuple, ranks[1])}
    assert sorted(ranks[0] + ranks[1]) == sorted(every[: len(every) // 2 * 2])
    # Lightning keeps it (a DistributedSampler), and tells it (and so yours) the epoch.
    loader = ResumableLoader(data, batch_sampler=LengthBuckets(LENGTHS))
    assert isinstance(loader.sampler, DistributedSampler) and loader.order == "batches"
    assert list(loader.batch_sampler) == every  # one process: every batch
    loader.sampler.set_epoch(3)
    assert loader.sampler.batches.epoch == 3
    # A batch sampler that splits itself among the processes is left to do it.
    splits_itself = LengthBuckets(LENGTHS)
    splits_itself.num_replicas = 2
    assert list(RankBatches(splits_itself, 2, 1, deal=False)) == every


class ShufflesGlobally(LengthBuckets):
    """A bucket sampler that shuffles its batches with Python's global `random`, as many do."""

    def __iter__(self):
        batches = list(super().__iter__())
        random.shuffle(batches)
        return iter(batches)


def test_a_batch_sampler_that_shuffles_with_the_global_generators_resumes_its_epoch():
    data = TensorDataset(torch.arange(40))
    random.seed(0)
    loader = ResumableLoader(data, batch_sampler=ShufflesGlobally(LENGTHS), seed=7)
    uninterrupted = epochs_of(loader, 2)
    assert not same_values(uninterrupted[0], uninterrupted[1])
    random.seed(123)  # the resumed process's own state: another one
    resumed = ResumableLoader(data, batch_sampler=ShufflesGlobally(LENGTHS), seed=7)
    list(resumed)
    resumed.resume_at(7, 1, 3 * resumed.world_batch)
    assert same_values(list(resumed), uninterrupted[1][3:])


def test_a_batch_sampler_that_splits_itself_among_the_processes_is_left_to_it(monkeypatch):
    from {{ cookiecutter.package_name }}.kit import data

    monkeypatch.setattr(data, "process_rank", lambda: (1, 2))
    data_set = TensorDataset(torch.arange(40))
    splits_itself = LengthBuckets(LENGTHS)
    splits_itself.num_replicas = 2  # as a DistributedSampler says it
    assert not ResumableLoader(data_set, batch_sampler=splits_itself).sampler.deal
    dealt = ResumableLoader(data_set, batch_sampler=LengthBuckets(LENGTHS))
    assert dealt.sampler.deal and (dealt.sampler.rank, dealt.sampler.num_replicas) == (1, 2)


def test_a_batch_sampler_lightning_rebuilt_around_its_sampler_is_checked():
    """Lightning gives a rebuilt batch sampler its DistributedSampler as the first argument:
    one built from lengths then reads the sampler's indices as lengths, every rank the same
    few batches. One that reads its indices from the sampler is right."""
    data = TensorDataset(torch.arange(40))
    share = DistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=0)
    misread = DataLoader(data, batch_sampler=KeepsItsLengths(share, 3, False))
    assert "KeepsItsLengths does not read its batches from it" in misread_batch_sampler(misread)
    copied = DataLoader(data, batch_sampler=LengthBuckets(share, 3, False))  # list(lengths)
    assert "cannot see where LengthBuckets keeps it" in misread_batch_sampler(copied)
    right = DataLoader(data, batch_sampler=BatchSamplerOfYours(share, 3, False))
    assert misread_batch_sampler(right) is None
    plain = DataLoader(data, batch_sampler=BatchSampler(SequentialSampler(data), 3, False))
    assert misread_batch_sampler(plain) is None


class KeepsItsLengths(LengthBuckets):
    """LengthBuckets keeping the lengths it is given as they are (a sampler, when Lightning
    gives it one)."""

    def __init__(self, lengths, batch_size: int = 3, drop_last: bool = False) -> None:
        super().__init__(lengths, batch_size, drop_last)
        self.lengths = lengths


class BatchSamplerOfYours(BatchSampler):
    """A batch sampler that reads its indices from the sampler it is given."""


class UnfreezesAtEpoch1(LightningModule):
    """A frozen first layer, unfrozen when epoch 1 starts (after DDP wrapped the model);
    each rank writes its weights' sum at the end."""

    def __init__(self, out: str) -> None:
        super().__init__()
        self.out = out
        self.first, self.second = nn.Linear(4, 8), nn.Linear(8, 1)
        self.first.requires_grad_(False)

    def on_train_epoch_start(self) -> None:
        if self.current_epoch == 1:
            self.first.requires_grad_(True)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return (self.second(torch.relu(self.first(x))) - x.sum(1, keepdim=True)).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def on_train_end(self) -> None:
        total = sum(float(p.double().sum()) for p in self.parameters())
        Path(self.out, f"rank{self.global_rank}").write_text(repr(total))


def averaged_on(rank: int, world: int, address: str, out: str) -> None:
    """One rank of a gloo group: a weight frozen when DDP wrapped the model and unfrozen
    after it, given the gradient rank + 1; what UnfrozenGradients makes of it, written."""
    from types import SimpleNamespace

    from {{ cookiecutter.package_name }}.kit.unfrozen import UnfrozenGradients

    torch.distributed.init_process_group("gloo", init_method=address, rank=rank, world_size=world)
    model = nn.Linear(2, 2)
    model.weight.requires_grad_(False)
    callback = UnfrozenGradients()
    callback._left_out = [model.weight]  # as on_fit_start finds it under DDP
    model.weight.requires_grad_(True)
    model.weight.grad = torch.full_like(model.weight, rank + 1.0)
    model.bias.grad = torch.full_like(model.bias, rank + 1.0)
    callback.on_after_backward(SimpleNamespace(world_size=world), model)
    Path(out, f"rank{rank}").write_text(f"{model.weight.grad.mean()} {model.bias.grad.mean()}")
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_the_gradients_of_weights_unfrozen_under_ddp_are_their_mean_over_the_ranks(tmp_path):
    """The mean of the ranks' gradients (as DDP's own), for the unfrozen weight alone."""
    from {{ cookiecutter.package_name }}.kit.machine import free_port

    address = f"tcp://127.0.0.1:{free_port()}"
    torch.multiprocessing.spawn(averaged_on, args=(2, address, str(tmp_path)), nprocs=2)
    seen = [(tmp_path / f"rank{rank}").read_text() for rank in (0, 1)]
    assert seen == ["1.5 1.0", "1.5 2.0"]  # the weight's averaged, DDP's bias left as it was


@pytest.mark.slow
def test_weights_unfrozen_under_ddp_train_alike_on_every_rank(tmp_path):
    """DDP averages only the gradients of the weights that trained when it wrapped the
    model; the kit's UnfrozenGradients averages the others' once they train."""
    from {{ cookiecutter.package_name }}.kit.unfrozen import UnfrozenGradients

    rows = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    data = DataLoader(TensorDataset(rows), batch_size=8)
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[UnfrozenGradients()],
    )
    trainer.fit(UnfreezesAtEpoch1(str(tmp_path)), data)
    sums = [(tmp_path / f"rank{rank}").read_text() for rank in (0, 1)]
    assert sums[0] == sums[1]


class TrainsOnLengthBuckets(LightningModule):
    """Trains on a plain DataLoader given a batch sampler built from lengths."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(1, 1)

    def train_dataloader(self) -> DataLoader:
        data = TensorDataset(torch.arange(40.0).unsqueeze(1))
        return DataLoader(data, batch_sampler=KeepsItsLengths(LENGTHS))

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def checked_on_two_processes() -> Trainer:
    """A one-epoch Trainer of two DDP processes with the kit's check of each rank's share."""
    from {{ cookiecutter.package_name }}.kit.shards import ShardCheck

    return Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ShardCheck()],
    )


@pytest.mark.slow
def test_a_batch_sampler_lightning_rebuilds_wrongly_under_ddp_stops_the_run():
    with pytest.raises(Exception, match="Lightning rebuilt it around a DistributedSampler"):
        checked_on_two_processes().fit(TrainsOnLengthBuckets())


class TrainsOnOneStream(LightningModule):
    """Trains on a stream that does not split itself among the processes."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def train_dataloader(self) -> DataLoader:
        return ResumableLoader(Shards(), batch_size=4)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.slow
def test_a_stream_that_gives_every_process_the_same_batches_stops_the_run():
    with pytest.raises(Exception, match="gave each of the 2 processes the same first batch"):
        checked_on_two_processes().fit(TrainsOnOneStream())
