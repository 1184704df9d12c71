"""Defaults that depend on the hardware the run will use: precision and matmul kernels.

Also `--compile.enabled true`, which compiles the network with torch.compile.

Mixed precision is the first speed-up worth having on a GPU:
bf16 where the card has it (Ampere and newer), since it keeps float32's range
and needs no gradient scaler; fp16 with a scaler on older cards; full float32
on the CPU, where autocast rarely pays. What counts is the accelerator the run
will actually use, not the machine: `--trainer.accelerator cpu` on a GPU
machine trains in float32.
"""

from collections.abc import Sequence
from typing import Any, Literal

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from .spec import ConfigError, units_of


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


class CompileNetwork(Callback):
    """`--compile.enabled true`: torch.compile the network, in place, before training.

    Each module the project wraps (`wrap`, the CLI's `Project.wrap`; by
    default each child of the LightningModule with weights), not the LightningModule:
    compiling the whole module would trace Lightning's hooks and logging too, which
    Lightning's docs advise against.
    `nn.Module.compile` keeps the module and its parameter names, so checkpoints
    and exports hold no `_orig_mod.` and load into an uncompiled network; under
    DDP the network is compiled before Lightning wraps it. The first steps are
    slow while the kernels are built (`--compile.mode` trades that time for
    speed: default, reduce-overhead, max-autotune).

    Args:
        enabled: compile the network before training.
        mode: torch.compile's mode: more build time for faster steps, from default to
            max-autotune.
        wrap: the attributes to compile, `Project.wrap` (the CLI gives it).
    """

    def __init__(
        self,
        enabled: bool = False,
        mode: Literal[
            "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"
        ] = "default",
        wrap: Sequence[str] | None = None,
    ) -> None:
        self.enabled = enabled
        self.mode = mode
        self.wrap = wrap

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if not self.enabled:
            return
        units = units_of(pl_module, self.wrap)
        if not units:
            raise ConfigError(
                f"compile.enabled: {type(pl_module).__name__} has no submodule with weights"
                " to compile; name them as Project.wrap in project.py"
            )
        from .sharding import FSDP2Strategy, find_blocks

        if isinstance(trainer.strategy, FSDP2Strategy):
            # FSDP gathers each block's parameters before it runs: compiled whole, the
            # network would trace those collectives; torchtitan compiles per block too.
            blocks = find_blocks(units, trainer.strategy.blocks) or units
            for block in blocks:
                block.compile(mode=self.mode)
            rank_zero_info(f"compile: each of {len(blocks)} blocks on its own, under FSDP")
            return
        for unit in units:
            unit.compile(mode=self.mode)
