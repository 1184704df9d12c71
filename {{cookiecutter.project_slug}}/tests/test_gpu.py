"""On a CUDA device: mixed precision, parameters and batches on the GPU, memory in use.

Kit test: it runs whatever model and data `project.py` names. Skipped without CUDA.
"""

import pytest
import torch
from lightning.pytorch import Callback
from torch.utils._pytree import tree_flatten

from {{ cookiecutter.package_name }}.kit.cli import main
from {{ cookiecutter.package_name }}.kit.health import TrainingHealth


class DeviceProbe(Callback):
    """Records where the parameters and the batch live during training."""

    def __init__(self):
        self.devices: set[str] = set()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.devices |= {p.device.type for p in pl_module.parameters()}
        leaves, _ = tree_flatten(batch)
        self.devices |= {t.device.type for t in leaves if isinstance(t, torch.Tensor)}


@pytest.mark.gpu
@pytest.mark.slow
def test_fit_on_gpu_in_the_resolved_precision(workdir):
    torch.cuda.reset_peak_memory_stats()
    probe = DeviceProbe()
    cli = main(["--trainer.max_epochs=2", "--trainer.logger=false"], run=False)
    cli.trainer.callbacks.append(probe)
    cli.trainer.fit(cli.model, cli.datamodule)
    trainer = cli.trainer
    assert probe.devices == {"cuda"}
    assert torch.cuda.max_memory_allocated() > 0
    assert trainer.train_dataloader.pin_memory is True
    bf16 = all(
        torch.cuda.get_device_capability(i)[0] >= 8 for i in range(torch.cuda.device_count())
    )
    assert trainer.precision == ("bf16-mixed" if bf16 else "16-mixed")
    (health,) = [c for c in trainer.callbacks if isinstance(c, TrainingHealth)]
    assert health.summary["peak_memory_mib"][0] > 0
    assert health.summary["samples_per_s"] > 0
