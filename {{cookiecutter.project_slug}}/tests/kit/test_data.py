"""Loader settings resolved from the machine, a split that never changes, and the
split DataModule's contract (any Dataset, a collate function, the predict split).

Kit test: the last tests run whatever DataModule `project.py` names.
"""

import pickle
import random

import numpy as np
import pytest
import torch
from host_syncs import CopiesToDevice
from lightning.pytorch import Trainer
from support import configured, first_batch, same_values
from torch.utils.data import ConcatDataset, DataLoader, Dataset, DistributedSampler, TensorDataset

from {{ cookiecutter.package_name }}.kit.data import (
    GlobalOrder,
    LoaderSettings,
    ResumableLoader,
    SeededSamples,
    SlicedLoader,
    SplitDataModule,
    TensorBatches,
    fits_on,
    is_in_memory,
    resolve_loader_settings,
    split_dataset,
    split_sizes,
)


@pytest.mark.parametrize(
    ("cpus", "local_world_size", "on_cuda", "expected"),
    [
        (2, 1, False, LoaderSettings(1, False, True)),  # this machine: one worker, one main
        (16, 1, True, LoaderSettings(8, True, True)),  # capped at 8 workers
        (16, 4, True, LoaderSettings(3, True, True)),  # 4 ranks share 16 CPUs
        (8, 8, True, LoaderSettings(0, True, False)),  # a CPU per rank: load in the main process
        (1, 1, False, LoaderSettings(0, False, False)),
    ],
)
def test_unset_loader_settings_follow_the_machine(cpus, local_world_size, on_cuda, expected):
    resolved = resolve_loader_settings(
        None, None, cpus=cpus, local_world_size=local_world_size, on_cuda=on_cuda
    )
    assert resolved == expected


def test_data_in_memory_needs_no_workers():
    resolved = resolve_loader_settings(
        None, None, cpus=16, local_world_size=1, on_cuda=True, in_memory=True
    )
    assert resolved == LoaderSettings(0, True, False)
    resolved = resolve_loader_settings(
        4, None, cpus=16, local_world_size=1, on_cuda=True, in_memory=True
    )
    assert resolved == LoaderSettings(4, True, True)


def test_explicit_loader_settings_win():
    resolved = resolve_loader_settings(0, True, cpus=64, local_world_size=1, on_cuda=False)
    assert resolved == LoaderSettings(0, True, False)
    resolved = resolve_loader_settings(3, False, cpus=1, local_world_size=1, on_cuda=True)
    assert resolved == LoaderSettings(3, False, True)


def test_negative_workers_name_the_value():
    with pytest.raises(ValueError, match=r"data.num_workers=-1: must be 0 or more"):
        resolve_loader_settings(-1, None, cpus=4, local_world_size=1, on_cuda=False)


def test_bad_split_fractions_name_the_values():
    with pytest.raises(ValueError, match=r"val_fraction=0.6, test_fraction=0.5"):
        split_sizes(100, 0.6, 0.5)


class Sentences(Dataset):
    """Stands for data read from disk: variable-length token ids and a label, as a dict."""

    def __init__(self, n: int = 10):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        return {"tokens": torch.arange(1 + index % 4), "label": index % 2}


class Declared(Dataset):
    in_memory = True

    def __len__(self):
        return 1

    def __getitem__(self, index):
        return 0


def test_in_memory_is_what_indexing_costs_not_a_class():
    tensors = TensorDataset(torch.zeros(4, 2))
    assert is_in_memory(tensors)
    assert is_in_memory(split_dataset(tensors, [2, 1, 1], seed=0)["train"])
    assert is_in_memory(ConcatDataset([tensors, Declared()]))
    assert not is_in_memory(Sentences())
    assert not is_in_memory(ConcatDataset([tensors, Sentences()]))


def test_split_dataset_is_disjoint_complete_and_seeded():
    dataset = Sentences(100)
    splits = split_dataset(dataset, split_sizes(100, 0.15, 0.15), seed=7)
    parts = [set(splits[name].indices) for name in ("train", "val", "test")]
    assert [len(p) for p in parts] == [70, 15, 15]
    assert set().union(*parts) == set(range(100))
    assert parts[1] == set(split_dataset(dataset, [70, 15, 15], seed=7)["val"].indices)
    assert parts[1] != set(split_dataset(dataset, [70, 15, 15], seed=8)["val"].indices)
    with pytest.raises(ValueError, match=r"split sizes \[70, 15\] add up to 85, not 100"):
        split_dataset(dataset, [70, 15], seed=7, names=("train", "val"))


class SentenceData(SplitDataModule):
    """Any Dataset per split, batched by its own collate function."""

    def make_splits(self):
        return split_dataset(Sentences(10), [6, 2, 2], self.hparams.split_seed)

    def collate_fn(self, samples):
        tokens = torch.nn.utils.rnn.pad_sequence([s["tokens"] for s in samples], batch_first=True)
        return {"tokens": tokens, "label": torch.tensor([s["label"] for s in samples])}


def test_split_datamodule_takes_any_dataset_a_collate_and_a_predict_split(monkeypatch):
    monkeypatch.setattr("{{ cookiecutter.package_name }}.kit.data.available_cpus", lambda: 3)
    datamodule = SentenceData(batch_size=4, predict_split="val")
    datamodule.trainer = Trainer(accelerator="cpu", devices=1, logger=False)
    datamodule.setup("fit")
    # Read per item: two workers of three CPUs, one CPU left for the training process.
    assert datamodule.loader_settings == LoaderSettings(2, False, True)
    loader = datamodule.train_dataloader()
    assert (loader.num_workers, loader.pin_memory, loader.persistent_workers) == (2, False, True)
    batch = next(iter(datamodule.val_dataloader()))
    assert set(batch) == {"tokens", "label"} and batch["tokens"].shape[0] == 2
    # Read through the kit's per-sample seeds (SeededSamples), which is the split's otherwise.
    predicted = datamodule.predict_dataloader().dataset
    assert predicted.dataset is datamodule.splits["val"] and len(predicted) == 2
    datamodule.hparams.predict_split = "unlabelled"
    with pytest.raises(KeyError, match=r"no 'unlabelled' split: SentenceData.make_splits\(\)"):
        datamodule.predict_dataloader()


def test_workers_started_by_spawn_or_forkserver_get_the_module_without_its_trainer():
    datamodule = SentenceData(batch_size=4)
    datamodule.trainer = Trainer(accelerator="cpu", devices=1, logger=False)
    datamodule.trainer.cli_parser = lambda: None  # as unpicklable as a CLI's parser
    datamodule.setup("fit")
    copy = pickle.loads(pickle.dumps(datamodule.collate_fn))  # what such a worker gets
    assert copy.__self__.trainer is None and datamodule.trainer is not None
    assert set(copy([datamodule.splits["train"][0]])) == {"tokens", "label"}


def test_the_configured_data_gives_batches_for_every_split():
    cli = configured()
    for split in ("train", "val", "test", "predict"):
        assert first_batch(cli, split) is not None, split


def test_the_configured_split_is_the_same_every_time():
    assert same_values(first_batch(configured(), "val"), first_batch(configured(), "val"))


class Tensors(SplitDataModule):
    def make_splits(self):
        x, y = torch.arange(40.0).reshape(20, 2), torch.arange(20)
        return split_dataset(TensorDataset(x, y), [10, 5, 5], self.hparams.split_seed)


def test_tensor_splits_are_sliced_a_batch_at_a_time(monkeypatch):
    datamodule = Tensors(batch_size=4)
    datamodule.setup("fit")
    assert all(isinstance(split, TensorBatches) for split in datamodule.splits.values())

    def per_sample(self, index):
        raise AssertionError("a batch of tensors is sliced at once, not read sample by sample")

    monkeypatch.setattr(TensorBatches, "__getitem__", per_sample)
    sliced = list(datamodule.val_dataloader())
    monkeypatch.undo()
    original = Tensors().make_splits()["val"]
    assert same_values(sliced, list(DataLoader(original, batch_size=4)))
    assert datamodule.loader_settings.num_workers == 0  # in memory: nothing for workers to do


@pytest.mark.parametrize("on_device", [None, True, False])
def test_a_split_of_tensors_is_a_tensor_dataset_whatever_on_device_says(on_device):
    """One documented type: `.tensors` works on every split, in the split's order."""
    datamodule = Tensors(on_device=on_device)
    datamodule.setup("fit")
    original = Tensors().make_splits()
    for name, split in datamodule.splits.items():
        assert isinstance(split, TensorDataset), (name, type(split))
        expected = torch.stack([original[name][i][0] for i in range(len(original[name]))])
        assert torch.equal(split.tensors[0], expected)
    assert isinstance(datamodule.splits["train"], TensorBatches) is (on_device is not False)


def test_tensors_stay_where_they_are_without_cuda():
    datamodule = Tensors(on_device=True)
    datamodule.setup("fit")  # no Trainer: the CPU
    assert datamodule.splits["train"].tensors[0].device.type == "cpu"
    assert not fits_on(torch.device("cpu"), [torch.zeros(1)])


def numbered(n: int) -> TensorBatches:
    """Samples whose values are their indices: a batch shows which samples it holds."""
    return TensorBatches(torch.arange(n, dtype=torch.float32).unsqueeze(1), torch.arange(n))


def held(loader) -> list[int]:
    return [int(i) for batch in loader for i in batch[1]]


def test_sliced_batches_follow_the_samplers_order():
    loader = SlicedLoader(numbered(10), batch_size=4, shuffle=True, seed=5)
    batches = list(loader)
    # A shuffled epoch trains whole steps: the 2 samples that fill none wait for the next.
    assert [len(b[1]) for b in batches] == [4, 4] == [len(b[0]) for b in batches]
    assert len({int(i) for b in batches for i in b[1]}) == 8
    # A DataLoader of the same seed reads the same order, sample by sample.
    plain = ResumableLoader(
        numbered(10), batch_size=4, shuffle=True, seed=5, collate_fn=lambda batch: batch
    )
    assert [int(i) for b in batches for i in b[1]] == held(plain) != list(range(10))
    assert len(loader) == 2
    loader = SlicedLoader(numbered(10), batch_size=4, drop_last=True)
    assert held(loader) == list(range(8)) and len(loader) == 2


def test_each_step_of_a_global_order_trains_the_same_samples_on_any_number_of_ranks():
    """Batch 4 on 2 ranks, 4 accumulating 2 on 1, 8 on 1: the same 8 samples a step, and
    each rank's batch is one of the 1-rank run's (BatchNorm sees the same batches)."""

    def steps(world: int, batch: int, accumulate: int) -> list[list[list[int]]]:
        ranks = []
        for rank in range(world):
            order = torch.Generator().manual_seed(3)
            sampler = GlobalOrder(
                numbered(23), batch, accumulate, generator=order, num_replicas=world, rank=rank
            )
            ranks.append(torch.tensor(list(sampler)).view(-1, accumulate, batch).tolist())
        return [[b for rank in ranks for b in rank[step]] for step in range(len(ranks[0]))]

    two, accumulating, one = steps(2, 4, 1), steps(1, 4, 2), steps(1, 8, 1)
    assert len(two) == 2  # 23 // 8 whole steps; the 7 left wait for another epoch's order
    for a, b, c in zip(two, accumulating, one, strict=True):
        assert a == b  # rank r's batch k is the 1-rank run's batch 2k + r
        assert sorted(i for batch in a for i in batch) == sorted(c[0])

    # Fewer samples than a step (tiny data): one step an epoch, each rank an equal share.
    def share(rank: int) -> list[int]:
        order = torch.Generator().manual_seed(3)
        return list(GlobalOrder(numbered(23), 8, 2, generator=order, num_replicas=2, rank=rank))

    shares = [share(0), share(1)]
    assert [len(share) for share in shares] == [11, 11] and not set(shares[0]) & set(shares[1])
    with pytest.raises(ValueError, match="1 training samples cannot give each of 2 processes"):
        GlobalOrder(numbered(1), 8, num_replicas=2, rank=0)


@pytest.mark.parametrize("kind", ["sliced", "per sample", "workers"])
def test_an_epoch_resumed_from_its_state_continues_with_the_next_batch(kind):
    def make(seed):
        if kind == "sliced":
            return SlicedLoader(numbered(23), batch_size=4, shuffle=True, seed=seed)
        workers = 1 if kind == "workers" else 0
        return ResumableLoader(
            numbered(23),
            batch_size=4,
            shuffle=True,
            seed=seed,
            num_workers=workers,
            persistent_workers=workers > 0,
            collate_fn=lambda batch: batch,
        )

    uninterrupted = make(7)
    torch.manual_seed(0)
    epochs = [[b[1].tolist() for b in uninterrupted] for _ in range(3)]
    assert epochs[0] != epochs[1] != epochs[2]  # reshuffled every epoch
    # Interrupted after 2 batches of epoch 1: the order is (seed, epoch)'s, whatever
    # the global random state, and the skipped batches are not read.
    resumed = make(seed=123)
    resumed.resume_at(seed=7, epoch=1, samples=8)
    torch.manual_seed(99)
    assert [b[1].tolist() for b in resumed] == epochs[1][2:]
    assert [b[1].tolist() for b in resumed] == epochs[2]  # and the next epoch in full
    assert len(resumed) == 5
    # Resumed at an epoch's start: that epoch in full.
    ended = make(seed=0)
    ended.resume_at(seed=7, epoch=1, samples=0)
    assert [b[1].tolist() for b in ended] == epochs[1]
    # Told its epoch as Lightning tells a sampler (a loader made anew each epoch): its order.
    told = make(7)
    told.sampler.set_epoch(2)
    assert [b[1].tolist() for b in told] == epochs[2]
    assert [b[1].tolist() for b in told] not in epochs  # then epoch 3: counted on from it


def test_sliced_batches_under_ddp_are_each_ranks_own_shard_reshuffled_every_epoch():
    data = numbered(11)
    seen = {}
    for rank in (0, 1):
        sampler = DistributedSampler(data, num_replicas=2, rank=rank, shuffle=True, seed=3)
        loader = SlicedLoader(data, batch_size=3, sampler=sampler)
        for epoch in (0, 1):
            seen[rank, epoch] = held(loader)  # the loader sets the sampler's epoch first
            assert sampler.epoch == epoch and seen[rank, epoch] == list(sampler)
    for epoch in (0, 1):
        assert set(seen[0, epoch]) | set(seen[1, epoch]) == set(range(11))
        assert len(set(seen[0, epoch]) & set(seen[1, epoch])) <= 1  # the padding sample
    assert seen[0, 0] != seen[0, 1]
    # A rank resumed mid-epoch continues its own shard of that epoch's order.
    sampler = DistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=3)
    loader = SlicedLoader(data, batch_size=3, sampler=sampler)
    loader.resume_at(seed=0, epoch=1, samples=6)  # one batch of 3 on each of 2 ranks
    assert held(loader) == seen[1, 1][3:]


def test_data_on_the_device_is_copied_once_an_epoch_not_once_a_batch():
    on_device = TensorBatches(*(t.to("meta") for t in numbered(40).tensors))
    loader = SlicedLoader(on_device, batch_size=4, shuffle=True)
    with CopiesToDevice("meta") as counted:
        for _ in range(2):  # two epochs of ten batches
            batches = list(loader)
            assert len(batches) == 10 and batches[0][0].device.type == "meta"
    assert counted.copies == 2  # each epoch's order, once
    # A DataLoader turns every batch's indices into a tensor on the device: a copy a batch.
    with CopiesToDevice("meta") as counted:
        batches = list(DataLoader(on_device, batch_size=4, collate_fn=lambda batch: batch))
    assert counted.copies == 10


def test_the_configured_in_memory_data_is_sliced_where_the_steps_run():
    cli = configured()
    datamodule = cli.datamodule
    datamodule.trainer = cli.trainer
    datamodule.prepare_data()
    datamodule.setup("fit")
    loader = datamodule.train_dataloader()
    if all(isinstance(split, TensorBatches) for split in datamodule.splits.values()):
        assert isinstance(loader, SlicedLoader)
        assert loader.num_workers == 0 and not loader.pin_memory


def test_workers_asked_for_are_given_even_to_data_in_memory():
    datamodule = Tensors(batch_size=4, num_workers=2)
    datamodule.setup("fit")
    loader = datamodule.train_dataloader()
    assert not isinstance(loader, SlicedLoader) and loader.num_workers == 2
    assert same_values(
        list(datamodule.val_dataloader()), list(Tensors(batch_size=4).val_dataloader())
    )


class Augmented(Dataset):
    """Samples augmented as torchvision's transforms do, drawing from torch's, Python's and
    NumPy's global generators: a row of [index, torch draw, random draw, NumPy draw]."""

    def __len__(self):
        return 23

    def __getitem__(self, index):
        return torch.tensor([index, torch.rand(()).item(), random.random(), np.random.rand()])


def mixed_up(samples):
    """A collate that draws too (mixup's permutation, say): a column of its own draws."""
    batch = torch.stack(samples)
    return torch.cat([batch, torch.rand(len(batch), 1)], dim=1)


def augmented(workers: int, seed: int = 7, **kwargs) -> ResumableLoader:
    return ResumableLoader(
        Augmented(),
        batch_size=4,
        shuffle=True,
        seed=seed,
        num_workers=workers,
        persistent_workers=workers > 0,
        collate_fn=mixed_up,
        **kwargs,
    )


def epochs_of(loader, epochs: int = 2) -> list[torch.Tensor]:
    return [torch.cat(list(loader)) for _ in range(epochs)]


@pytest.mark.slow  # loader workers start for it; a synthetic dataset, whatever the model
def test_a_samples_random_draws_depend_on_the_sample_and_the_epoch_alone():
    """Whatever reads it: the training process or 2 workers, from any global random state."""
    torch.manual_seed(0)
    alone = epochs_of(augmented(0))
    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    with_workers = epochs_of(augmented(2))
    for ours, theirs in zip(alone, with_workers, strict=True):
        assert torch.equal(ours, theirs)
    first, second = alone
    assert not torch.equal(first[:, 1:], second[:, 1:])  # a new epoch, new draws
    # One sample index in one epoch: the same augmentation in any batch it lands in.
    by_index = {int(row[0]): row[1:4] for row in first}
    again = epochs_of(augmented(0), epochs=1)[0]
    assert all(torch.equal(by_index[int(row[0])], row[1:4]) for row in again)
    # Reading the data moves none of the training process's own generators (its dropout).
    states = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    list(augmented(0))
    assert torch.equal(states[0], torch.get_rng_state()) and states[1] == random.getstate()
    assert np.array_equal(states[2], np.random.get_state()[1])


@pytest.mark.parametrize("workers", [0, 2])
def test_an_augmented_epoch_resumed_mid_way_draws_what_it_would_have(workers):
    uninterrupted = epochs_of(augmented(workers))
    resumed = augmented(workers, seed=123)
    resumed.resume_at(seed=7, epoch=1, samples=8)
    torch.manual_seed(99)  # another global state: it does not matter
    assert torch.equal(torch.cat(list(resumed)), uninterrupted[1][8:])


def test_seeded_samples_can_be_turned_off_and_data_in_memory_is_read_as_it_is():
    loader = augmented(0, seed_samples=False)
    assert isinstance(loader.dataset, Augmented)
    torch.manual_seed(0)
    first = torch.cat(list(loader))
    torch.manual_seed(1)
    assert not torch.equal(first[:, 1], torch.cat(list(loader))[:, 1])  # the global state's
    assert not isinstance(ResumableLoader(numbered(4)).dataset, SeededSamples)
    # Rebuilt from its own attributes (as Lightning does to add a DistributedSampler):
    # seeded once, with the collate function it was given.
    seeded = augmented(0).dataset
    rebuilt = ResumableLoader(seeded, batch_size=4, collate_fn=lambda batch: batch)
    assert rebuilt.dataset.dataset is seeded.dataset and rebuilt.dataset.collate_fn is mixed_up
