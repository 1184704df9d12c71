"""Callbacks that tell you what the run is really doing.

`EnvironmentReport` prints, once on rank 0 when training starts, everything that
decides where and how fast the run goes: versions and build of torch, the GPUs
(the free memory of its own), accelerator, strategy, world size, precision, batch
sizes and loader settings, and the memory per rank of the weights, gradients
and optimizer state, replicated (DDP) and sharded (FSDP) at the run's world size.
A wrong line here (a CPU build of torch, one device where you asked for eight)
is cheaper to spot than a slow week. Batch size and loader settings are read
from the training DataLoader itself, so they are shown for any DataModule.
"""

from collections.abc import Mapping
from contextlib import nullcontext
from itertools import chain
from typing import Any

import lightning
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from .data import RankBatches
from .footprint import human, params_of, per_rank
from .machine import build_name, cuda_devices


def torch_build() -> str:
    """What this torch was compiled for: 'CUDA 12.4', 'ROCm 6.1' or 'CPU-only'."""
    return build_name(torch.version.cuda, getattr(torch.version, "hip", None))


def keep_context(error: BaseException, context: dict[str, Any]) -> None:
    """Keep what the hints quote (batch size, precision, devices, where the tensors
    were) with the error itself; what an earlier account said wins over this one."""
    try:
        error.run_context = {**context, **getattr(error, "run_context", {})}  # type: ignore[attr-defined]
    except AttributeError:  # an exception type that takes no attributes
        pass


def train_loaders(trainer: Trainer) -> list[Any]:
    """The training loaders of a fit once its loop built them, however the module or
    DataModule nested them (one, a list, a dict)."""
    try:
        loaders = trainer.train_dataloader
    except AttributeError:  # no fit loop data yet
        return []
    if isinstance(loaders, Mapping):
        return list(loaders.values())
    if isinstance(loaders, list | tuple):
        return list(loaders)
    return [] if loaders is None else [loaders]


def train_loader(trainer: Trainer) -> DataLoader | None:
    """The training DataLoader once the fit loop built it (the first, if there are several)."""
    loaders = train_loaders(trainer)
    first = loaders[0] if loaders else None
    return first if isinstance(first, DataLoader) else None


def loader_facts(trainer: Trainer) -> dict[str, Any]:
    """Batch size (per device and effective; or the batch sampler of yours that sizes each
    batch) and loader settings of the training DataLoader."""
    loader = train_loader(trainer)
    if loader is None:
        return dict.fromkeys(
            (
                "batch_size",
                "effective_batch_size",
                "batch_sampler",
                "num_workers",
                "pin_memory",
                "persistent_workers",
            )
        )
    batches = loader.batch_sampler
    if isinstance(batches, RankBatches):  # yours, dealt out by the kit
        batches = batches.batches
    batch_size = loader.batch_size or getattr(batches, "batch_size", None)
    effective = None
    if batch_size:
        effective = batch_size * trainer.accumulate_grad_batches * trainer.world_size
    return {
        "batch_size": batch_size,
        "effective_batch_size": effective,
        # A batch sampler that sizes each batch itself (one of a points budget, say).
        "batch_sampler": None if batch_size or batches is None else type(batches).__name__,
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "persistent_workers": loader.persistent_workers,
    }


def data_parallel_size(trainer: Trainer) -> int:
    """The ranks that shard (FSDP) or replicate (DDP) the model: the world size, less
    a ModelParallelStrategy's tensor-parallel dimension once its mesh is set up."""
    if isinstance(trainer.strategy, ModelParallelStrategy):
        try:
            mesh = trainer.strategy.device_mesh
        except RuntimeError:  # before the processes are set up
            return trainer.world_size
        if "data_parallel" in (mesh.mesh_dim_names or ()):
            return mesh["data_parallel"].size()
    return trainer.world_size


def memory_facts(trainer: Trainer) -> dict[str, Any] | None:
    """Bytes per rank of the live model's weights (and buffers), gradients and optimizer
    state, held whole (DDP) and sharded (FSDP) over this run's ranks (kit/memory.py).
    Cheap: shapes only; activations need a step, so `doctor --memory` measures them.
    None without a model, or under FSDP1, whose flattened shards hide the shapes."""
    module = trainer.lightning_module
    if module is None or isinstance(trainer.strategy, FSDPStrategy):
        return None
    params, buffers, optimizer = params_of(module, trainer.optimizers or None)
    ranks = data_parallel_size(trainer)
    return {
        "optimizer": optimizer.name,
        "ranks": ranks,
        "ddp_bytes": per_rank(params, ranks, False, buffers).states,
        "fsdp_bytes": per_rank(params, ranks, True, buffers).states,
        "sharded": isinstance(trainer.strategy, ModelParallelStrategy),
    }


def collect_environment(trainer: Trainer) -> dict[str, Any]:
    """The facts of the report, as plain values (tests and scripts read these)."""
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    device = trainer.strategy.root_device
    return {
        "torch": torch.__version__,
        "torch_build": torch_build(),
        "lightning": lightning.__version__,
        "cuda_available": torch.cuda.is_available(),
        "cudnn": cudnn,
        # Free memory of this rank's own device only: asking another device
        # would open a CUDA context on it, memory taken from its own rank.
        "gpus": cuda_devices(free_of={device.index or 0} if device.type == "cuda" else ()),
        "accelerator": type(trainer.accelerator).__name__,
        "strategy": type(trainer.strategy).__name__,
        "devices": trainer.num_devices,
        "num_nodes": trainer.num_nodes,
        "world_size": trainer.world_size,
        "precision": trainer.precision,
        "matmul_precision": torch.get_float32_matmul_precision(),
        "accumulate_grad_batches": trainer.accumulate_grad_batches,
        **loader_facts(trainer),
        "memory": memory_facts(trainer),
    }


def format_environment(facts: dict[str, Any]) -> str:
    """One compact block, a few `key: value` pairs a line."""
    lines = [
        f"torch {facts['torch']} ({facts['torch_build']}) | lightning {facts['lightning']}"
        f" | cuDNN {facts['cudnn'] or 'none'} | CUDA available: {facts['cuda_available']}",
    ]
    lines += [
        f"GPU {g['index']}: {g['name']} | {g['free_gib']} GiB free of {g['total_gib']} GiB"
        if g["free_gib"] is not None
        else f"GPU {g['index']}: {g['name']} | {g['total_gib']} GiB"
        for g in facts["gpus"]
    ]
    lines.append(
        f"accelerator: {facts['accelerator']} | strategy: {facts['strategy']}"
        f" | devices {facts['devices']} x nodes {facts['num_nodes']}"
        f" = world size {facts['world_size']}"
    )
    lines.append(f"precision: {facts['precision']} | float32 matmul: {facts['matmul_precision']}")
    if facts["batch_size"] is not None:
        lines.append(
            f"batch: {facts['batch_size']} per device x {facts['accumulate_grad_batches']}"
            f" accumulated x {facts['world_size']} ranks"
            f" = {facts['effective_batch_size']} effective"
        )
    elif facts.get("batch_sampler"):
        lines.append(
            f"batch: as {facts['batch_sampler']} makes each, per device x"
            f" {facts['accumulate_grad_batches']} accumulated x {facts['world_size']} ranks"
        )
    if facts["num_workers"] is not None:
        lines.append(
            f"loader: num_workers {facts['num_workers']} | pin_memory {facts['pin_memory']}"
            f" | persistent_workers {facts['persistent_workers']}"
        )
    memory = facts.get("memory")
    if memory:
        ranks = f"{memory['ranks']} rank{'s' if memory['ranks'] != 1 else ''}"
        lines.append(
            f"memory per rank (weights, gradients, {memory['optimizer']} state):"
            f" DDP {human(memory['ddp_bytes'])} | FSDP over {ranks} {human(memory['fsdp_bytes'])}"
            f" | this run {'shards' if memory['sharded'] else 'replicates'}"
            " | activations: see doctor --memory"
        )
    width = max(len(line) for line in lines)
    rule = "-" * min(width, 100)
    return "\n".join(["Environment", rule, *lines, rule])


class EnvironmentReport(Callback):
    """Prints the environment report on rank 0 when training starts."""

    def __init__(self) -> None:
        self.facts: dict[str, Any] = {}

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.is_global_zero:  # one report per run; no communication needed
            self.facts = collect_environment(trainer)
            rank_zero_info(format_environment(self.facts))


class FailureContext(Callback):
    """Keeps what the error hints quote with the error (`keep_context`): the
    run's settings, and where the module's tensors were when a step failed (before
    Lightning moves them back)."""

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        where: dict[str, list[str]] = {}
        for name, tensor in chain(pl_module.named_parameters(), pl_module.named_buffers()):
            where.setdefault(str(tensor.device), []).append(name)
        context = {
            "precision": trainer.precision,
            "devices": trainer.num_devices,
            "accumulate_grad_batches": trainer.accumulate_grad_batches,
            "cuda_device_count": torch.cuda.device_count(),
            "batch_size": loader_facts(trainer)["batch_size"],
            "batch_sampler": loader_facts(trainer)["batch_sampler"],
            "tensor_devices": {
                device: names[:4] + ([f"... {len(names) - 4} more"] if len(names) > 4 else [])
                for device, names in where.items()
            },
        }
        keep_context(exception, {key: value for key, value in context.items() if value})


# The hooks a Callback may define: Lightning calls each of them on every callback.
HOOKS = tuple(
    name
    for name, value in vars(Callback).items()
    if callable(value) and (name.startswith("on_") or name in ("setup", "teardown"))
)


class KitCallbacks(Callback):
    """The kit's callbacks as one callback, calling each hook only on the parts that define it.

    Lightning calls every hook of every callback, and does so about six times a
    step; with a dozen callbacks that dispatch alone costs more than a small
    model's step (Lightning has no way to skip the hooks a callback does not
    define). Here a hook that one part defines is that part's own method, one
    that several define calls them in order, and the rest cost nothing. Each
    part keeps its own checkpointed state, under its own name.
    """

    def __init__(self, parts: list[Callback]) -> None:
        self.parts = list(parts)
        for hook in HOOKS:
            calls = [
                getattr(part, hook)
                for part in self.parts
                if getattr(type(part), hook) is not getattr(Callback, hook)
            ]
            if len(calls) == 1:
                setattr(self, hook, calls[0])
            elif calls:
                setattr(self, hook, _in_order(calls))

    def __repr__(self) -> str:
        return f"KitCallbacks({', '.join(type(part).__name__ for part in self.parts)})"

    def state_dict(self) -> dict[str, Any]:
        return {part.state_key: state for part in self.parts if (state := part.state_dict())}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for part in self.parts:
            if part.state_key in state_dict:
                part.load_state_dict(state_dict[part.state_key])


def _in_order(calls: list) -> Any:
    def call(*args, **kwargs) -> None:
        for fn in calls:
            fn(*args, **kwargs)

    return call


class NoProfiler(PassThroughProfiler):
    """Lightning's profiler for runs without one, at a tenth of its cost.

    Lightning wraps every hook call (a few dozen a step) in `profiler.profile`,
    which for its pass-through profiler is still a generator-based context
    manager, about a microsecond each; this one returns the same empty context
    every time. `--trainer.profiler simple` (configs/profile.yaml) replaces it.
    """

    _nothing = nullcontext()

    def profile(self, action_name: str) -> nullcontext:
        return self._nothing


def find_callback(trainer: Trainer, kind: type) -> Any:
    """The trainer's callback of type `kind`, also among the kit's parts; None if absent."""
    for callback in trainer.callbacks:
        for part in getattr(callback, "parts", None) or [callback]:
            if isinstance(part, kind):
                return part
    return None
