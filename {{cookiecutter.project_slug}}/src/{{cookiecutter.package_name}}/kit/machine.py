"""Facts about this machine's torch build and GPUs, for the doctor and the environment
report. Imports torch only when asked, and never Lightning."""

import random
import socket
from collections.abc import Container
from typing import Any

GIB = 1024**3

# Below Linux's ephemeral ports (32768-60999). Lightning takes MASTER_PORT from those
# (a bind to port 0); while rank 0 starts, the other ranks keep connecting to it, and
# one attempt can be given that very port as its own source port and connect to
# itself (TCP self-connect): rank 0's bind then fails with EADDRINUSE. A port below
# the range is never a connection's source.
RENDEZVOUS_PORTS = range(20000, 32768)


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


def free_port(ports: range = RENDEZVOUS_PORTS, tries: int = 100) -> int:
    """A port of `ports` that no socket of this machine holds now, chosen at random (by
    the system's generator: two jobs seeded alike would otherwise pick the same port)."""
    for port in random.SystemRandom().sample(ports, min(tries, len(ports))):
        with socket.socket() as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1} after {tries} tries")
