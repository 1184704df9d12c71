"""The environment report says what the run will really use; the progress bar
reads metrics only when they are new.

Kit test: the fit runs whatever model and data `project.py` names.
"""

import logging
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks.progress.progress_bar import ProgressBar
from torch.utils.data import DataLoader, TensorDataset

from {{ cookiecutter.package_name }}.kit.callbacks import (
    EnvironmentReport,
    RichBar,
    TQDMBar,
    collect_environment,
    format_environment,
    torch_build,
)
from {{ cookiecutter.package_name }}.kit.cli import main
from {{ cookiecutter.package_name }}.kit.doctor import cuda_devices

GPU_FACTS = {
    "torch": "2.5.1+cu124",
    "torch_build": "CUDA 12.4",
    "lightning": "2.6.0",
    "cuda_available": True,
    "cudnn": 90100,
    "gpus": [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "free_gib": 78.9, "total_gib": 79.1},
        {"index": 1, "name": "NVIDIA H100 80GB HBM3", "free_gib": 12.5, "total_gib": 79.1},
        # Another rank's device: its free memory is not asked for.
        {"index": 2, "name": "NVIDIA H100 80GB HBM3", "free_gib": None, "total_gib": 79.1},
    ],
    "accelerator": "CUDAAccelerator",
    "strategy": "DDPStrategy",
    "devices": 2,
    "num_nodes": 2,
    "world_size": 4,
    "precision": "bf16-mixed",
    "matmul_precision": "high",
    "batch_size": 64,
    "accumulate_grad_batches": 4,
    "effective_batch_size": 1024,
    "num_workers": 7,
    "pin_memory": True,
    "persistent_workers": True,
}


def test_report_of_a_multi_gpu_run_shows_every_fact():
    report = format_environment(GPU_FACTS)
    for expected in [
        "torch 2.5.1+cu124 (CUDA 12.4)",
        "lightning 2.6.0",
        "cuDNN 90100",
        "CUDA available: True",
        "GPU 0: NVIDIA H100 80GB HBM3 | 78.9 GiB free of 79.1 GiB",
        "GPU 1: NVIDIA H100 80GB HBM3 | 12.5 GiB free of 79.1 GiB",
        "GPU 2: NVIDIA H100 80GB HBM3 | 79.1 GiB\n",
        "accelerator: CUDAAccelerator | strategy: DDPStrategy",
        "devices 2 x nodes 2 = world size 4",
        "precision: bf16-mixed | float32 matmul: high",
        "batch: 64 per device x 4 accumulated x 4 ranks = 1024 effective",
        "loader: num_workers 7 | pin_memory True | persistent_workers True",
    ]:
        assert expected in report


def test_report_on_this_machine_at_fit_start(workdir, caplog):
    with caplog.at_level(logging.INFO):
        cli = main(["fit", "--trainer.fast_dev_run=true", "--trainer.accumulate_grad_batches=2"])
    (report,) = [c for c in cli.trainer.callbacks if isinstance(c, EnvironmentReport)]
    facts = report.facts
    assert facts["torch"] == torch.__version__
    assert facts["torch_build"] == torch_build()
    assert facts["cuda_available"] is torch.cuda.is_available()
    assert (facts["devices"], facts["num_nodes"], facts["world_size"]) == (1, 1, 1)
    if not torch.cuda.is_available():
        assert facts["accelerator"] == "CPUAccelerator"
        assert facts["strategy"] == "SingleDeviceStrategy"
        assert facts["precision"] == "32-true"
    # Read from the training DataLoader itself, whatever the DataModule.
    loader = cli.trainer.train_dataloader
    batch_size = loader.batch_size
    assert (facts["batch_size"], facts["effective_batch_size"]) == (batch_size, 2 * batch_size)
    settings = (loader.num_workers, loader.pin_memory, loader.persistent_workers)
    assert (facts["num_workers"], facts["pin_memory"], facts["persistent_workers"]) == settings
    printed = caplog.text
    assert "Environment" in printed
    assert (
        f"batch: {batch_size} per device x 2 accumulated x 1 ranks = {2 * batch_size} effective"
        in printed
    )
    assert f"loader: num_workers {settings[0]} | pin_memory {settings[1]}" in printed


def test_cpu_build_is_named(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    assert torch_build() == "CPU-only"
    monkeypatch.setattr(torch.version, "cuda", "12.1")
    assert torch_build() == "CUDA 12.1"


def test_facts_without_a_training_loader_leave_batch_lines_out():
    trainer = Trainer(accelerator="cpu", devices=1, logger=False)
    facts = collect_environment(trainer)
    assert facts["batch_size"] is None and facts["num_workers"] is None
    report = format_environment(facts)
    assert "batch:" not in report and "loader:" not in report


def test_free_memory_is_asked_of_the_own_device_only(monkeypatch):
    """mem_get_info opens a CUDA context on the device it asks: a rank asks its own."""
    asked = []
    props = SimpleNamespace(name="NVIDIA H200", major=9, minor=0, total_memory=140 * 1024**3)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(
        torch.cuda, "mem_get_info", lambda index: asked.append(index) or (70 * 1024**3, 0)
    )
    devices = cuda_devices(free_of={1})
    assert asked == [1]
    assert [d["free_gib"] for d in devices] == [None, 70.0, None]
    assert [d["total_gib"] for d in devices] == [140.0] * 3
    cuda_devices()  # doctor: every device
    assert asked == [1, 0, 1, 2]


class LogsEveryStep(LightningModule):
    """Logs the step number to the progress bar at every step, as many modules do."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        self.log("shown", float(self.global_step + 1), prog_bar=True)
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit_counting_reads(tmp_path, monkeypatch, callback) -> list[int]:
    """Seven steps logged every third; the steps after which the bar read the metrics."""
    reads = []
    read = ProgressBar.get_metrics

    def counted(self, trainer, pl_module):
        if self._in_step:
            reads.append(trainer.global_step)
        return read(self, trainer, pl_module)

    monkeypatch.setattr(ProgressBar, "get_metrics", counted)
    trainer = Trainer(
        accelerator="cpu",
        max_steps=7,
        log_every_n_steps=3,
        callbacks=[callback],
        default_root_dir=tmp_path,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(LogsEveryStep(), DataLoader(TensorDataset(torch.ones(8, 2)), batch_size=1))
    return reads


@pytest.mark.parametrize("bar", [RichBar, TQDMBar])
def test_the_bar_reads_metrics_only_on_logging_steps(tmp_path, monkeypatch, bar):
    callback = bar()
    # After a step: the first, and the logging steps 3 and 6; the epoch's end
    # reads the last step's value.
    assert fit_counting_reads(tmp_path, monkeypatch, callback) == [1, 3, 6]
    assert callback._shown["shown"] == 7.0


def test_a_bar_refreshed_every_other_step_still_reads_each_logging_steps_values(
    tmp_path, monkeypatch
):
    # It refreshes after steps 2, 4 and 6: it reads at 2 (its first), at 4 (step 3
    # logged) and at 6 (which logged).
    assert fit_counting_reads(tmp_path, monkeypatch, TQDMBar(refresh_rate=2)) == [2, 4, 6]


def test_the_cli_uses_the_bar_and_leaves_it_out_when_disabled(workdir):
    cli = main(["--trainer.logger=false"], run=False)
    assert type(cli.trainer.progress_bar_callback) in (RichBar, TQDMBar)
    cli = main(["--trainer.logger=false", "--trainer.enable_progress_bar=false"], run=False)
    assert cli.trainer.progress_bar_callback is None
