"""MFU against the right peak: the dense FLOP/s of the GPU in use, by the name PyTorch
reports, for the precision in use; an unknown GPU says so once.

Kit test: the GPUs are faked (their name and compute capability), so it runs on the CPU.
"""

import logging
from types import SimpleNamespace

import pytest
import torch

from {{ cookiecutter.package_name }}.kit.health import TrainingHealth
from {{ cookiecutter.package_name }}.kit.peaks import CHIPS, chip_of


def fake_gpu(monkeypatch, name: str, capability: tuple[int, int]) -> torch.device:
    """A CUDA device as the health report sees it: its name and compute capability."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    return torch.device("cuda", 0)


HOPPER, BLACKWELL, ADA, AMPERE = (9, 0), (10, 0), (8, 9), (8, 0)


@pytest.mark.parametrize(
    ("name", "capability", "precision", "tflops"),
    [
        # The names PyTorch reports, dense figures (no sparsity).
        ("NVIDIA H200", HOPPER, "bf16-mixed", 989.5),
        ("NVIDIA H200", HOPPER, "16-mixed", 989.5),
        ("NVIDIA H200", HOPPER, "32-true", 494.5),  # TF32, as the kit sets it on CUDA
        ("NVIDIA H200 NVL", HOPPER, "bf16-mixed", 835.5),
        ("NVIDIA H100 80GB HBM3", HOPPER, "bf16-mixed", 989.5),
        ("NVIDIA H100 PCIe", HOPPER, "bf16-mixed", 756.5),
        ("NVIDIA H100 NVL", HOPPER, "bf16-mixed", 835.5),
        ("NVIDIA GH200 480GB", HOPPER, "bf16-mixed", 990),
        ("NVIDIA H20", HOPPER, "bf16-mixed", 148),
        ("NVIDIA B200", BLACKWELL, "bf16-mixed", 2250),
        ("NVIDIA GB200", BLACKWELL, "bf16-mixed", 2500),
        ("NVIDIA L40S", ADA, "bf16-mixed", 362.05),  # not an L4, as Lightning reads it
        ("NVIDIA L4", ADA, "bf16-mixed", 121),
        ("NVIDIA A100-SXM4-80GB", AMPERE, "bf16-mixed", 312),
        ("NVIDIA A10G", AMPERE, "16-mixed", 125),
        ("Tesla V100-SXM2-16GB", (7, 0), "16-mixed", 125),  # Lightning's own table
    ],
)
def test_mfu_peaks_of_current_gpus_by_the_name_pytorch_reports(
    monkeypatch, name, capability, precision, tflops
):
    from {{ cookiecutter.package_name }}.kit.health import peak_flops

    device = fake_gpu(monkeypatch, name, capability)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        assert peak_flops(device, precision) == pytest.approx(tflops * 1e12)
    finally:
        torch.set_float32_matmul_precision(previous)


def test_every_listed_gpu_has_a_source_and_every_precision_the_kit_resolves():
    for pattern, chip, peaks, source in CHIPS:
        assert source and chip, pattern
        assert {"bfloat16", "float16", "tfloat32", "float32"} <= set(peaks), chip
        assert peaks["bfloat16"] >= peaks["tfloat32"] >= peaks["float32"] / 2, chip
        assert chip_of(f"NVIDIA {chip}") is not None or chip_of(chip) is not None, chip


def test_an_unknown_gpu_says_its_peak_is_unknown_once(monkeypatch, caplog):
    from {{ cookiecutter.package_name }}.kit import health as module

    device = fake_gpu(monkeypatch, "NVIDIA Z9000", HOPPER)
    assert module.peak_flops(device, "bf16-mixed") is None
    health = TrainingHealth()
    facts = {
        "samples_per_s": 100.0,
        "data_wait_share": 0.1,
        "clock": "device",
        "flops_per_batch": 10**9,
        "flops_per_s": 1e12,
        "peak_flops": None,
        "mfu": None,
        "peak_unknown": "NVIDIA Z9000 in torch.bfloat16",
        "peak_memory_mib": [512.0],
        "effective_batch_size": 64,
        "batches": 10,
        "optimizer_steps": 10,
    }
    monkeypatch.setattr(health, "measure", lambda trainer, pl_module: dict(facts))
    trainer = SimpleNamespace(world_size=1)
    with caplog.at_level(logging.INFO):
        health.report(trainer, None, final=False)
        health.report(trainer, None, final=True)
    lines = [r.message for r in caplog.records if r.message.startswith("Training health")]
    assert "MFU: peak unknown for NVIDIA Z9000 in torch.bfloat16" in lines[0]
    assert "peak unknown" not in lines[1]
    assert "data wait 10% of step time (device clock)" in lines[1]
    assert "1 GFLOP per training step (forward and backward), 1 TFLOP/s" in lines[1]
