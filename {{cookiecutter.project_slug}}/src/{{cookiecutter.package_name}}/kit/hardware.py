"""Defaults that depend on the hardware the run will use: precision and matmul kernels.

Mixed precision is the first speed-up worth having on a GPU (the guide, 6.1):
bf16 where the card has it (Ampere and newer), since it keeps float32's range
and needs no gradient scaler; fp16 with a scaler on older cards; full float32
on the CPU, where autocast rarely pays. What counts is the accelerator the run
will actually use, not the machine: `--trainer.accelerator cpu` on a GPU
machine trains in float32.
"""

from typing import Any

import torch


def cuda_capabilities() -> tuple[bool, bool]:
    """(CUDA usable, every visible device supports bf16)."""
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return False, False
    bf16 = all(
        torch.cuda.get_device_capability(i)[0] >= 8 for i in range(torch.cuda.device_count())
    )
    return True, bf16


def mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def run_accelerator(accelerator: Any, cuda: bool, mps: bool = False) -> str:
    """'cuda', 'mps' or 'cpu' (or the accelerator's own name): what `--trainer.accelerator`
    resolves to on a machine with (`cuda`, `mps`)."""
    name = accelerator if isinstance(accelerator, str) else type(accelerator).__name__
    if isinstance(accelerator, dict):  # class_path form
        name = str(accelerator.get("class_path", "")).rpartition(".")[2]
    name = name.lower().removesuffix("accelerator") or "auto"
    if name in ("auto", "gpu"):
        if cuda:
            return "cuda"
        if mps:
            return "mps"
        return "cpu" if name == "auto" else "gpu"
    return name


def resolve_precision(accelerator: str, bf16: bool) -> str:
    """The precision the Trainer gets when the user names none."""
    if accelerator != "cuda":
        return "32-true"
    return "bf16-mixed" if bf16 else "16-mixed"


def use_tensor_cores() -> None:
    """float32 matmuls in TF32 on CUDA ('high'): much faster, precise enough to train."""
    if torch.cuda.is_available():
        torch.set_float32_matmul_precision("high")
