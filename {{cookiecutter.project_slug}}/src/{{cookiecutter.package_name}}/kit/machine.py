"""Facts about this machine's torch build and GPUs, for the doctor and the environment
report. Imports torch only when asked, and never Lightning."""

from collections.abc import Container
from typing import Any

GIB = 1024**3


def build_name(cuda: str | None, hip: str | None) -> str:
    """'CUDA 12.4', 'ROCm 6.1' or 'CPU-only': what a torch was compiled for."""
    if cuda:
        return f"CUDA {cuda}"
    if hip:
        return f"ROCm {hip}"
    return "CPU-only"


def cuda_devices(free_of: Container[int] | None = None) -> list[dict[str, Any]]:
    """Name, compute capability, free/total memory and bf16 of each visible CUDA device.

    Free memory needs a CUDA context on the device (a few hundred MB of its
    memory): with `free_of`, only those devices are asked, the others report
    `free_gib` None. A training rank asks for its own device only.
    """
    import torch

    if not torch.cuda.is_available():
        return []
    devices = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        free = None
        if free_of is None or index in free_of:
            free = round(torch.cuda.mem_get_info(index)[0] / GIB, 1)
        devices.append(
            {
                "index": index,
                "name": props.name,
                "capability": f"{props.major}.{props.minor}",
                "free_gib": free,
                "total_gib": round(props.total_memory / GIB, 1),
                "bf16": props.major >= 8,
            }
        )
    return devices
