"""The training-health report: numbers that add up, and warnings when they should."""

import logging
import time
import warnings

import pytest
import torch
from lightning.pytorch import Trainer
from torch.utils.data import Dataset

from {{ cookiecutter.package_name }}.cli import DataModule, Model, main
from {{ cookiecutter.package_name }}.health import TrainingHealth, batch_length, batchnorm_advice


class SlowSplit(Dataset):
    """Wraps a split with a __getitem__ that sleeps, as heavy decoding would."""

    def __init__(self, inner, delay: float):
        self.inner, self.delay = inner, delay

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, index):
        time.sleep(self.delay)
        return self.inner[index]


def quiet_trainer(health: TrainingHealth, **kwargs) -> Trainer:
    """A CPU Trainer with `health` and nothing else that writes or prints."""
    return Trainer(
        accelerator="cpu",
        devices=1,
        callbacks=[health],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


# The wait a fast in-memory dataset still shows: per-sample indexing and collation
{%- if cookiecutter.example == "digits" %}
# are small next to the CNN's step.
FAST_WAIT_CEILING = 0.3
{%- else %}
# are a quarter of the tiny MLP's step (measured 0.18-0.25 on 2 CPUs).
FAST_WAIT_CEILING = 0.5
{%- endif %}


def fit_with_health(delay: float, data_wait_warn: float = 0.3) -> tuple[TrainingHealth, list]:
    datamodule = DataModule(batch_size=32, num_workers=0)
    datamodule.setup("fit")
    if delay:
        datamodule.splits = {k: SlowSplit(v, delay) for k, v in datamodule.splits.items()}
    health = TrainingHealth(data_wait_warn=data_wait_warn)
    trainer = quiet_trainer(health, max_steps=12, limit_val_batches=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Model(), datamodule)
    return health, [str(w.message) for w in caught]


def test_slow_dataset_triggers_the_data_wait_warning():
    health, messages = fit_with_health(delay=0.002)  # 32 x 2 ms per batch
    summary = health.summary
    assert summary["steps"] == 12
    assert summary["data_wait_share"] > 0.5
    warning = next(m for m in messages if "waited for data" in m)
    assert "1. more loader workers (--data.num_workers, now 0)" in warning
    assert warning.index("workers") < warning.index("__getitem__") < warning.index("pinned")
    assert "precompute" in warning


def test_fast_dataset_does_not_warn_and_the_numbers_add_up():
    health, messages = fit_with_health(delay=0, data_wait_warn=FAST_WAIT_CEILING)
    summary = health.summary
    assert not any("waited for data" in m for m in messages)
    assert 0 <= summary["data_wait_share"] < FAST_WAIT_CEILING
    assert summary["effective_batch_size"] == 32
    busy = health.wait + health.compute
    assert summary["samples_per_s"] == pytest.approx(12 * 32 / busy, rel=0.01)
    assert summary["samples_per_s"] > 100  # a CPU does thousands; 100 means something broke
    assert summary["peak_memory_mib"] is None  # only measured on CUDA


def test_report_is_printed_at_fit_end(workdir, caplog):
    with caplog.at_level(logging.INFO):
        main(["fit", "--trainer.max_epochs=1", "--trainer.enable_progress_bar=false"])
    line = next(r.message for r in caplog.records if r.message.startswith("Training health"))
    assert "samples/s | data wait" in line and "effective batch 64" in line


def test_batch_length_of_common_batch_shapes():
    assert batch_length(torch.zeros(5, 3)) == 5
    assert batch_length((torch.zeros(7, 2), torch.zeros(7))) == 7
    assert batch_length({"x": torch.zeros(4, 1)}) == 4
    assert batch_length(None) == 0


def test_batchnorm_advice():
    with_bn = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    without = torch.nn.Sequential(torch.nn.Linear(2, 2))
    assert batchnorm_advice(without, world_size=8, accumulate=4, micro_batch=16) is None
    assert batchnorm_advice(with_bn, world_size=1, accumulate=1, micro_batch=16) is None
    assert "--trainer.sync_batchnorm true" in batchnorm_advice(with_bn, 4, 1, 16)
    assert "micro-batch of 16 samples" in batchnorm_advice(with_bn, 1, 4, 16)
    synced = torch.nn.SyncBatchNorm.convert_sync_batchnorm(with_bn)
    assert batchnorm_advice(synced, world_size=4, accumulate=1, micro_batch=16) is None
{%- if cookiecutter.example == "digits" %}


def test_accumulating_a_batchnorm_model_warns_once():
    trainer = quiet_trainer(
        TrainingHealth(), max_steps=2, accumulate_grad_batches=4, limit_val_batches=0
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Model(), DataModule(batch_size=16))
    advice = [str(w.message) for w in caught if "BatchNorm with accumulate" in str(w.message)]
    assert len(advice) == 1 and "micro-batch of 16 samples" in advice[0]
{%- endif %}
