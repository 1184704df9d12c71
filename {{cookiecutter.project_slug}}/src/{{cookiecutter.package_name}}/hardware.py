"""Defaults that depend on the hardware: which precision, which matmul kernels.

Mixed precision is the first speed-up worth having on a GPU (the guide, 6.1):
bf16 where the card has it (Ampere and newer), since it keeps float32's range
and needs no gradient scaler; fp16 with a scaler on older cards; full float32
on the CPU, where autocast rarely pays.
"""

import torch


def cuda_capabilities() -> tuple[bool, bool]:
    """(CUDA usable, every visible device supports bf16)."""
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return False, False
    bf16 = all(
        torch.cuda.get_device_capability(i)[0] >= 8 for i in range(torch.cuda.device_count())
    )
    return True, bf16


def resolve_precision(cuda: bool, bf16: bool) -> str:
    """The precision the Trainer gets when the user names none."""
    if not cuda:
        return "32-true"
    return "bf16-mixed" if bf16 else "16-mixed"


def use_tensor_cores() -> None:
    """float32 matmuls in TF32 on CUDA ('high'): much faster, precise enough to train."""
    if torch.cuda.is_available():
        torch.set_float32_matmul_precision("high")
