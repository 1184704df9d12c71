"""On a CUDA device: mixed precision, the model and its batches on the GPU, data in
memory sliced there with no copy a batch, no step that makes the host wait for the
device between logging steps, a health report with MFU and peak memory, and a
checkpoint's state copied to pinned host memory with one wait.

Kit test: it runs whatever model and data `project.py` names. Skipped without CUDA.
"""

import logging
import warnings

import pytest
import torch
from host_syncs import CopiesToDevice
from lightning.pytorch import Callback
from support import main
from torch.utils._pytree import tree_flatten

from {{ cookiecutter.package_name }}.kit.callbacks import find_callback
from {{ cookiecutter.package_name }}.kit.checkpoints import BackgroundWriter
from {{ cookiecutter.package_name }}.kit.console import logs_this_step
from {{ cookiecutter.package_name }}.kit.data import SlicedLoader
from {{ cookiecutter.package_name }}.kit.health import TrainingHealth

SYNC = "called a synchronizing CUDA operation"  # how CUDA's sync debug mode says it

WARM_UP = 3  # steps that may sync once: FLOP counting, cuDNN's choice of kernels


class OnTheDevice(Callback):
    """Per step after the first few: whether the logger wrote, the syncs CUDA saw (its
    sync debug mode warns at each), the tensors copied from the host; and where the
    parameters and the batches were. A step's window runs from its batch to the next,
    or to validation: `ends_in_validation` says which, per step."""

    def __init__(self):
        self.devices: set[str] = set()
        self.steps: list[tuple[bool, list[str], int]] = []
        self.ends_in_validation: list[bool] = []
        self._copies = CopiesToDevice("cuda")
        self._step = None

    def _close(self, validation: bool = False) -> None:
        if self._step is None:
            return
        torch.cuda.set_sync_debug_mode(0)
        logs, caught, recorded, copies_before = self._step
        self._copies.__exit__(None, None, None)
        caught.__exit__(None, None, None)
        # CUDA's words for a sync; its notice that the mode is a prototype is not one.
        syncs = [str(w.message) for w in recorded if SYNC in str(w.message)]
        self.steps.append((logs, syncs, self._copies.copies - copies_before))
        self.ends_in_validation.append(validation)
        self._step = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._close()
        leaves, _ = tree_flatten(batch)
        self.devices |= {t.device.type for t in leaves if isinstance(t, torch.Tensor)}
        self.devices |= {p.device.type for p in pl_module.parameters()}
        if trainer.global_step < WARM_UP:
            return
        logs = logs_this_step(trainer)
        caught = warnings.catch_warnings(record=True)
        recorded = caught.__enter__()
        warnings.simplefilter("always")
        self._copies.__enter__()
        self._step = (logs, caught, recorded, self._copies.copies)
        torch.cuda.set_sync_debug_mode("warn")

    def on_validation_start(self, trainer, pl_module):
        self._close(validation=True)

    def on_train_epoch_end(self, trainer, pl_module):
        self._close()

    def on_exception(self, trainer, pl_module, exception):
        self._close()


@pytest.mark.gpu
@pytest.mark.slow
def test_fit_on_the_gpu_waits_for_nothing_between_logging_steps(workdir, caplog):
    probe = OnTheDevice()
    with caplog.at_level(logging.INFO):
        cli = main(
            [
                "fit",
                "--trainer.devices=1",  # in this process: DDP would start new ones
                "--trainer.max_epochs=2",
                "--trainer.log_every_n_steps=5",
                "--trainer.logger=false",
            ],
            callbacks=[probe],
        )
    trainer = cli.trainer
    assert probe.devices == {"cuda"}
    bf16 = all(
        torch.cuda.get_device_capability(i)[0] >= 8 for i in range(torch.cuda.device_count())
    )
    assert trainer.precision == ("bf16-mixed" if bf16 else "16-mixed")

    quiet = [step for step in probe.steps if not step[0]]
    logging_steps = [step for step in probe.steps if step[0]]
    assert quiet and logging_steps
    # fp16 (cards without bf16) scales the loss, and PyTorch's GradScaler reads whether
    # the gradients overflowed at every optimizer step: one read a step, by design.
    allowed = 0 if trainer.precision == "bf16-mixed" else 1
    assert [syncs for _, syncs, _ in quiet if len(syncs) > allowed] == []
    assert all(len(syncs) <= 1 + allowed for _, syncs, _ in logging_steps), logging_steps
    loader = trainer.train_dataloader
    if isinstance(loader, SlicedLoader) and loader.dataset.tensors[0].is_cuda:
        # Data in GPU memory: each batch a slice there, nothing copied from the host but
        # each loader's order once an epoch: the validation loader's when it starts.
        copies = [copies for _, _, copies in probe.steps]
        ceiling = [int(validation) for validation in probe.ends_in_validation]
        assert all(c <= most for c, most in zip(copies, ceiling, strict=True)), copies

    health = find_callback(trainer, TrainingHealth)
    summary = health.summary
    assert summary["clock"] == "device"
    assert summary["peak_memory_mib"][0] > 0 and summary["samples_per_s"] > 0
    assert summary["flops_per_batch"] and summary["flops_per_s"] > 0
    line = next(r.message for r in caplog.records if r.message.startswith("Training health"))
    assert "MFU " in line or "MFU: peak unknown for" in line
    if summary["mfu"] is not None:
        assert 0 < summary["mfu"] < 1


@pytest.mark.gpu
@pytest.mark.slow
def test_a_cuda_state_is_copied_to_pinned_buffers_and_waited_for_once(monkeypatch):
    writer, synced = BackgroundWriter(), []
    synchronize = torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: synced.append(1) or synchronize())
    weights = torch.randn(1024, 1024, device="cuda")
    before = weights.cpu()
    state = {"state_dict": {"a": weights, "b": weights * 2}, "rng": torch.get_rng_state()}
    staged = writer.stage(state)
    weights.add_(1.0)  # the next step, queued after the copies
    assert synced == [1]
    assert staged["state_dict"]["a"].is_pinned() and staged["state_dict"]["b"].is_pinned()
    assert torch.equal(staged["state_dict"]["a"], before)
