"""Loader settings resolved from the machine, and a split that never changes."""

import pytest
import torch
from lightning.pytorch import Trainer
from torch.utils.data import Dataset, TensorDataset

from {{ cookiecutter.package_name }}.cli import DataModule
from {{ cookiecutter.package_name }}.data import (
    LoaderSettings,
    random_split,
    resolve_loader_settings,
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


def test_tensors_in_memory_need_no_workers():
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


class FileBacked(Dataset):
    """Stands for data read from disk: not a TensorDataset, so workers pay off."""

    def __len__(self):
        return 8

    def __getitem__(self, index):
        return torch.zeros(2), 0


def test_setup_resolves_from_the_trainer_and_the_data(monkeypatch):
    monkeypatch.setattr("{{ cookiecutter.package_name }}.data.available_cpus", lambda: 3)
    datamodule = DataModule()
    datamodule.trainer = Trainer(accelerator="cpu", devices=1, logger=False)
    datamodule.setup("fit")
    assert datamodule.loader_settings == LoaderSettings(0, False, False)  # tensors in memory

    datamodule = DataModule()
    datamodule.make_splits = lambda: {"train": FileBacked(), "val": FileBacked()}
    datamodule.trainer = Trainer(accelerator="cpu", devices=1, logger=False)
    datamodule.setup("fit")
    assert datamodule.loader_settings == LoaderSettings(2, False, True)
    loader = datamodule.train_dataloader()
    assert (loader.num_workers, loader.pin_memory, loader.persistent_workers) == (2, False, True)


def test_random_split_is_disjoint_complete_and_seeded():
    dataset = TensorDataset(torch.arange(100))
    splits = random_split(dataset, split_sizes(100, 0.15, 0.15), seed=7)
    parts = [set(splits[name].tensors[0].tolist()) for name in ("train", "val", "test")]
    assert [len(p) for p in parts] == [70, 15, 15]
    assert set().union(*parts) == set(range(100))
    assert parts[1] == set(random_split(dataset, [70, 15, 15], seed=7)["val"].tensors[0].tolist())
    assert parts[1] != set(random_split(dataset, [70, 15, 15], seed=8)["val"].tensors[0].tolist())


def test_example_split_is_the_same_every_time():
    first, second = DataModule(), DataModule()
    first.setup("fit")
    second.setup("fit")
    for name in ("train", "val", "test"):
        for a, b in zip(first.splits[name].tensors, second.splits[name].tensors, strict=True):
            assert torch.equal(a, b)
    inputs = [first.splits[name].tensors[0] for name in ("train", "val", "test")]
{%- if cookiecutter.example == "digits" %}
    assert [len(t) for t in inputs] == [1257, 270, 270]
    x, y = first.splits["train"][0]
    assert x.shape == (1, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.long
    assert set(first.splits["train"].tensors[1].tolist()) == set(range(10))
{%- else %}
    assert [len(t) for t in inputs] == [2868, 614, 614]
    x, y = first.splits["train"][0]
    assert x.shape == (16,) and y.shape == (1,)
{%- endif %}
