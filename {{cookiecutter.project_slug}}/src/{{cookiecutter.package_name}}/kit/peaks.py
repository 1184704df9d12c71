"""Peak FLOP/s of current GPUs, per dtype: what MFU is measured against.

Lightning's own table (`get_available_flops`) knows an H200 only by names that
PyTorch does not report ("NVIDIA H200"), lists its figures with sparsity,
takes an L40S for an L4, gives an A40's or an A6000's bf16 as their non-tensor
rate, and has no Blackwell, GH200 or H20. This table answers first, for the
GPUs it names; Lightning's answers for the rest (older and consumer GPUs).

Every figure is dense (no 2:4 sparsity), in FLOP/s per GPU as PyTorch sees it,
from the vendor's datasheet named beside it; where a datasheet gives only
figures with sparsity, they are halved. float32 means TF32 tensor cores when
`torch.get_float32_matmul_precision()` is not "highest" (the kit sets "high"
on CUDA), as cuBLAS then uses them.
"""

import re
import warnings

import torch

T = 1e12
BF16, FP16, FP32, TF32, FP64 = "bfloat16", "float16", "float32", "tfloat32", "float64"


def _chip(bf16: float, tf32: float, fp32: float, fp64: float | None = None) -> dict[str, float]:
    peaks = {BF16: bf16 * T, FP16: bf16 * T, TF32: tf32 * T, FP32: fp32 * T}
    if fp64 is not None:
        peaks[FP64] = fp64 * T
    return peaks


# (pattern of the lower-case name PyTorch reports, chip, dense peaks in TFLOP/s, source).
# Order matters: the first pattern that matches wins.
CHIPS: list[tuple[str, str, dict[str, float], str]] = [
    # NVIDIA Blackwell
    (r"\bgb300\b", "GB300", _chip(2500, 1250, 80), "NVIDIA GB300 NVL72 datasheet, per GPU"),
    (r"\bb300\b", "B300", _chip(2250, 1125, 75, 1.25), "NVIDIA HGX B300 datasheet, per GPU"),
    (r"\bgb200\b", "GB200", _chip(2500, 1250, 80, 40), "NVIDIA GB200 NVL72 datasheet, per GPU"),
    (r"\bb200\b", "B200", _chip(2250, 1100, 75, 37), "NVIDIA HGX B200 datasheet, per GPU"),
    (
        r"rtx pro 6000 blackwell",
        "RTX PRO 6000 Blackwell",
        _chip(503.8, 251.9, 125),
        "NVIDIA RTX PRO 6000 Blackwell Workstation Edition datasheet (Max-Q and Server"
        " Edition clock lower)",
    ),
    # NVIDIA Hopper
    (r"\bgh200\b", "GH200", _chip(990, 494, 67, 67), "NVIDIA GH200 Grace Hopper datasheet"),
    (r"\bh200 nvl\b", "H200 NVL", _chip(835.5, 417.5, 60, 60), "NVIDIA H200 datasheet, H200 NVL"),
    (r"\bh200\b", "H200 SXM", _chip(989.5, 494.5, 67, 67), "NVIDIA H200 datasheet, H200 SXM"),
    (r"\bh100 nvl\b", "H100 NVL", _chip(835.5, 417.5, 60, 60), "NVIDIA H100 datasheet, H100 NVL"),
    (r"\bh100 pcie\b", "H100 PCIe", _chip(756.5, 378, 51, 51), "NVIDIA H100 datasheet, H100 PCIe"),
    (r"\bh100\b", "H100 SXM", _chip(989.5, 494.5, 67, 67), "NVIDIA H100 datasheet, H100 SXM"),
    (r"\bh800 pcie\b", "H800 PCIe", _chip(756.5, 378, 51, 0.8), "NVIDIA H800 PCIe datasheet"),
    (r"\bh800\b", "H800 SXM", _chip(989.5, 494.5, 67, 1), "NVIDIA H800 SXM datasheet"),
    (r"\bh20\b", "H20", _chip(148, 74, 44, 1), "NVIDIA H20 datasheet"),
    # NVIDIA Ada
    (r"\bl40s\b", "L40S", _chip(362.05, 183, 91.6), "NVIDIA L40S datasheet"),
    (r"\bl40\b", "L40", _chip(181.05, 90.5, 90.5), "NVIDIA L40 datasheet"),
    (r"\bl4\b", "L4", _chip(121, 60, 30.3), "NVIDIA L4 datasheet"),
    (
        r"rtx 6000 ada",
        "RTX 6000 Ada",
        _chip(364.2, 182.1, 91.1),
        "NVIDIA RTX 6000 Ada Generation datasheet (1,457 FP8 TFLOPS with sparsity)",
    ),
    # NVIDIA Ampere
    (r"\ba100\b|\ba800\b", "A100", _chip(312, 156, 19.5, 19.5), "NVIDIA A100 datasheet"),
    (r"\ba30\b", "A30", _chip(165, 82, 10.3, 10.3), "NVIDIA A30 datasheet"),
    (r"\ba40\b", "A40", _chip(149.7, 74.8, 37.4), "NVIDIA A40 datasheet"),
    (r"\ba10g?\b", "A10", _chip(125, 62.5, 31.2), "NVIDIA A10 datasheet"),
    (r"rtx a6000", "RTX A6000", _chip(154.8, 77.4, 38.7), "NVIDIA RTX A6000 datasheet"),
    # AMD Instinct (PyTorch's ROCm build reports them as CUDA devices)
    (r"\bmi325x\b", "MI325X", _chip(1307.4, 653.7, 163.4, 163.4), "AMD Instinct MI325X datasheet"),
    (r"\bmi300x\b", "MI300X", _chip(1307.4, 653.7, 163.4, 163.4), "AMD Instinct MI300X datasheet"),
]


def dtype_key(dtype: torch.dtype, tf32: bool) -> str:
    """The table's column for a compute dtype; float32 becomes TF32 where it is in use."""
    name = str(dtype).removeprefix("torch.")
    return TF32 if name == FP32 and tf32 else name


def chip_of(device_name: str) -> tuple[str, dict[str, float], str] | None:
    """(chip, peaks, source) for a device name as PyTorch reports it; None if not listed."""
    lowered = device_name.lower().replace("-", " ")
    for pattern, chip, peaks, source in CHIPS:
        if re.search(pattern, lowered):
            return chip, peaks, source
    return None


def uses_tf32() -> bool:
    """Whether float32 matmuls run on TF32 tensor cores: Ampere or newer, and allowed."""
    major, _ = torch.cuda.get_device_capability()
    return major >= 8 and torch.get_float32_matmul_precision() != "highest"


def cuda_peak(device: torch.device, dtype: torch.dtype) -> float | None:
    """Dense peak FLOP/s of a CUDA `device` in `dtype`: this table, else Lightning's; None
    if neither knows the device or the dtype."""
    name = torch.cuda.get_device_name(device)
    found = chip_of(name)
    if found is not None:
        return found[1].get(dtype_key(dtype, uses_tf32()))
    from lightning.fabric.utilities.throughput import get_available_flops

    with warnings.catch_warnings():  # its own "not found" warning: the report says it once
        warnings.simplefilter("ignore")
        peak = get_available_flops(device, dtype)
    return float(peak) if peak else None
