"""On a CUDA device: bf16 mixed precision, parameters on the GPU, memory in use."""

import pytest
import torch
from lightning.pytorch import Callback, Trainer

from {{ cookiecutter.package_name }}.cli import DataModule, Model
from {{ cookiecutter.package_name }}.health import TrainingHealth


class DeviceProbe(Callback):
    """Records where the parameters and the batch live during training."""

    def __init__(self):
        self.devices: set[str] = set()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.devices |= {p.device.type for p in pl_module.parameters()}
        self.devices |= {t.device.type for t in batch}


@pytest.mark.gpu
@pytest.mark.slow
def test_fit_on_gpu_in_bf16(workdir):
    torch.cuda.reset_peak_memory_stats()
    probe, health = DeviceProbe(), TrainingHealth()
    trainer = Trainer(
        accelerator="gpu",
        devices=1,
        precision="bf16-mixed",
        max_epochs=2,
        callbacks=[probe, health],
        logger=False,
        enable_checkpointing=False,
    )
    datamodule = DataModule(batch_size=128)
    trainer.fit(Model(), datamodule)
    assert probe.devices == {"cuda"}
    assert torch.cuda.max_memory_allocated() > 0
    assert datamodule.loader_settings.pin_memory is True
    assert trainer.precision == "bf16-mixed"
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    assert health.summary["peak_memory_mib"][0] > 0
    assert health.summary["samples_per_s"] > 0
