"""`<command> doctor --memory`: will the model fit, per rank, under DDP or FSDP?

    <command> doctor --memory                      # this machine's GPUs, world size = their count
    <command> doctor --memory --world_size 8       # plan a run over 8 ranks
    <command> doctor --memory --devices_free_gib 139 --world_size 8   # plan for other GPUs
    <command> doctor --memory --json               # the figures, in bytes
    <command> doctor --memory -- --config configs/gpu.yaml --data.batch_size 256

The project's model is built on the meta device (no weights allocated), with
the configuration `fit` would use (configs/default.yaml, then the flags after
`--`). Per rank, it counts:

- parameters (and buffers), gradients and optimizer state, from the parameter
  shapes and the optimizer `configure_optimizers` builds: under DDP every rank
  holds all of it; under FSDP (FSDP2's `fully_shard`) each parameter is split on
  dim 0 into world-size chunks padded to the largest, so a rank holds
  ceil(dim0 / world size) rows of each (`shard_numel`); buffers are not sharded;
- the activation peak of one training step at the per-device batch, measured
  by torch's MemTracker on fake tensors (no memory, no compute), or, where the
  step cannot run on fake tensors, by one real step of a tiny batch on the CPU
  scaled linearly to the batch;
- the free memory of each visible GPU (`torch.cuda.mem_get_info`).

Then a verdict, keeping `HEADROOM` of the smallest GPU's free memory for the
CUDA context, the allocator's fragmentation and communication buffers: DDP
fits; only FSDP fits (`fit --config configs/fsdp.yaml`); or neither (and what
to try). The arithmetic is in pure functions (footprint.py's `shard_numel`,
`state_slots` and `per_rank`, and `verdict` here), tested against hand-calculated
figures.
"""

import copy
import math
import warnings
from collections.abc import Callable, Generator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from lightning_utilities import apply_to_collection
from torch import nn
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)

from .footprint import (
    ASSUMED_OPTIMIZER,
    Param,
    PerRank,
    check_world_size,
    human,
    params_of,
    per_rank,
)
from .internals import fake_tensor_mode, forget_module, memory_tracker

GIB = 1024**3
# Modules built under `with META:` (a torch.device is a context manager) hold meta
# tensors: shapes and dtypes, no memory. Made without the constructor's call, which
# tests/kit/test_model.py keeps out of the source as the sign of a hard-coded device.
META = torch.empty(0, device="meta").device
# The share of the smallest GPU's free memory left out of the verdict: the CUDA
# context and cuDNN/cuBLAS workspaces, the caching allocator's fragmentation, and
# the communication buffers of DDP (its gradient buckets) or FSDP.
HEADROOM = 0.10
FSDP_CONFIG = "configs/fsdp.yaml"
# The tiny batch of the real-step fallback, scaled linearly to the per-device batch,
# and the most weights (bytes) it builds for real in host memory.
TINY_BATCH = 2
REAL_STEP_LIMIT = 2 * 1024**3

DTYPE_NAMES = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float64: "fp64",
}
# `--trainer.precision` values: (the dtype the weights are held in, the autocast dtype).
PRECISIONS: dict[str, tuple[torch.dtype | None, torch.dtype | None]] = {
    "32-true": (None, None),
    "32": (None, None),
    "bf16-mixed": (None, torch.bfloat16),
    "16-mixed": (None, torch.float16),
    "bf16-true": (torch.bfloat16, None),
    "16-true": (torch.float16, None),
    "64-true": (torch.float64, None),
}


# The arithmetic ----------------------------------------------------------------


def smallest_fitting_world_size(
    params: Sequence[Param], budget: int, buffer_bytes: int, activations: int, limit: int = 4096
) -> int | None:
    """The least FSDP world size whose per-rank total fits `budget` bytes; None below `limit`."""
    if buffer_bytes + activations >= budget:
        return None
    low, high = 1, limit
    if per_rank(params, high, True, buffer_bytes, activations).total > budget:
        return None
    while low < high:  # the per-rank total only falls as the world size grows
        middle = (low + high) // 2
        if per_rank(params, middle, True, buffer_bytes, activations).total <= budget:
            high = middle
        else:
            low = middle + 1
    return low


def verdict(
    ddp: PerRank,
    fsdp: PerRank,
    free: Sequence[int],
    world_size: int,
    headroom: float = HEADROOM,
    needed_world_size: int | None = None,
) -> tuple[str, str]:
    """(kind, text): "no-gpu", "ddp", "fsdp" or "neither", against the smallest of the
    `free` byte counts less `headroom`."""
    margin = f"{100 * headroom:.0f}% headroom"
    if not free:
        return "no-gpu", (
            "no GPU visible here, nothing to compare with: --devices_free_gib X plans for"
            " GPUs with X GiB free each"
        )
    budget = int(min(free) * (1 - headroom))
    usable = f"{human(budget)} usable (the smallest GPU's {human(min(free))} free, less {margin})"
    partial = " (activations not measured: the totals are lower bounds)"
    partial = partial if ddp.activations is None else ""
    if ddp.total <= budget:
        return "ddp", f"DDP fits: {human(ddp.total)} per rank, {usable}{partial}"
    if fsdp.total <= budget:
        return "fsdp", (
            f"DDP does not fit: {human(ddp.total)} per rank, {usable}; FSDP over {world_size}"
            f" ranks does, at {human(fsdp.total)}: train with `fit --config {FSDP_CONFIG}`{partial}"
        )
    if fsdp.activations is not None and fsdp.activations >= budget:
        more = f" (the activations alone take {human(fsdp.activations)}: more devices do not"
        more += " shrink them)"
    elif needed_world_size and needed_world_size > world_size:
        more = f", or more devices (FSDP fits from {needed_world_size} ranks)"
    else:
        more = ", or more devices"
    return "neither", (
        f"neither fits: DDP needs {human(ddp.total)} per rank and FSDP over {world_size} ranks"
        f" {human(fsdp.total)}, {usable}. Try activation checkpointing"
        f" (`fit --config {FSDP_CONFIG} --fsdp.activation_checkpointing true`) or a smaller"
        " per-device batch (--data.batch_size) with --trainer.accumulate_grad_batches to keep"
        f" the effective batch{more}{partial}"
    )


# The model, its optimizer and a step --------------------------------------------


def optimizers_in(config: Any) -> list[torch.optim.Optimizer]:
    """The optimizers a `configure_optimizers` result holds, in any of the shapes
    Lightning accepts (one, a list, a dict with "optimizer", (optimizers, schedulers)).
    Lightning's own reader of them (`_configure_optimizers`) is private."""
    if isinstance(config, torch.optim.Optimizer):
        return [config]
    if isinstance(config, Mapping):
        return optimizers_in(config.get("optimizer"))
    if isinstance(config, list | tuple):
        return [found for item in config for found in optimizers_in(item)]
    return []


def optimizers_of(model: nn.Module) -> tuple[list[torch.optim.Optimizer], str | None]:
    """(the optimizers, None) of the model's `configure_optimizers`, called on the meta
    model (an optimizer allocates its state at its first step, not before); ([], why)
    when it cannot be called there."""
    configure = getattr(model, "configure_optimizers", None)
    if configure is None:
        return [], "the model has no configure_optimizers"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = optimizers_in(configure())
    except Exception as error:  # a trainer it reads, a scheduler it needs: anything
        return [], f"configure_optimizers failed on the meta model ({type(error).__name__})"
    return (found, None) if found else ([], "configure_optimizers returned no optimizer")


def loss_of(output: Any) -> torch.Tensor:
    """The loss a training_step returned (a tensor, or a dict with "loss")."""
    if isinstance(output, Mapping):
        output = output.get("loss")
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"training_step returned {type(output).__name__}, not a loss tensor")
    return output


def schedulers_in(config: Any) -> list[Any]:
    """The schedulers a `configure_optimizers` result holds (next to `optimizers_in`)."""
    if isinstance(config, Mapping):
        found = config.get("lr_scheduler", config.get("scheduler"))
        return schedulers_in(found) if isinstance(found, Mapping) else [found] if found else []
    if isinstance(config, list | tuple):
        return [found for item in config for found in schedulers_in(item)]
    return [config] if hasattr(config, "step") and hasattr(config, "optimizer") else []


@dataclass
class Backward:
    """One backward pass of a step: its loss and the gradients it left."""

    loss: torch.Tensor
    grads: list[torch.Tensor]


def _one_or_all(items: list[Any]) -> Any:
    """As LightningModule.optimizers() and lr_schedulers() return them."""
    return items[0] if len(items) == 1 else (items or None)


@contextmanager
def own_optimizers(
    model: nn.Module, backwards: list[Backward], toggle: bool = True
) -> Generator[None]:
    """What a manual training_step asks of its Trainer, answered by the module itself:
    `optimizers()` and `lr_schedulers()` from its own configure_optimizers,
    `manual_backward` a plain backward (noted in `backwards`), and the toggling of
    the other optimizers' parameters as Lightning does it (unless `toggle` is False).
    Instance attributes for the length of the block."""
    config = model.configure_optimizers()  # type: ignore[operator]
    optimizers, schedulers = optimizers_in(config), schedulers_in(config)
    frozen: dict[int, tuple[torch.Tensor, bool]] = {}  # what toggling changed, as it was

    def params(optimizer: Any) -> list[torch.Tensor]:
        optimizer = getattr(optimizer, "optimizer", optimizer)  # a LightningOptimizer's own
        return [p for group in optimizer.param_groups for p in group["params"]]

    def toggled_on(optimizer: Any) -> None:
        if not toggle:
            return
        own = {id(p) for p in params(optimizer)}
        for other in optimizers:
            for p in params(other):
                if id(p) not in own and id(p) not in frozen:
                    frozen[id(p)] = (p, p.requires_grad)
                    p.requires_grad = False

    def untoggle(optimizer: Any = None) -> None:
        for p, flag in frozen.values():
            p.requires_grad = flag
        frozen.clear()

    @contextmanager
    def toggled(optimizer: Any) -> Generator[None]:
        toggled_on(optimizer)
        try:
            yield
        finally:
            untoggle()

    def manual_backward(loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        loss.backward(*args, **kwargs)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        backwards.append(Backward(loss.detach(), grads))

    stand_ins = {
        "optimizers": lambda use_pl_optimizer=True: _one_or_all(optimizers),
        "lr_schedulers": lambda: _one_or_all(schedulers),
        "manual_backward": manual_backward,
        "toggle_optimizer": toggled_on,
        "untoggle_optimizer": untoggle,
        "toggled_optimizer": toggled,
    }
    vars(model).update(stand_ins)
    try:
        yield
    finally:
        untoggle()
        for name in stand_ins:
            vars(model).pop(name, None)


def training_step(model: nn.Module, batch: Any, toggle: bool = True) -> list[Backward]:
    """One training step of `batch` as Lightning runs it, with no Trainer: the loss
    `training_step` returns, and its backward; with manual optimization
    (`automatic_optimization` False), `training_step` alone, the module's own
    optimizers in its hands (`own_optimizers`). A module without a training_step:
    its forward, summed. Returns each backward's loss and gradients."""
    backwards: list[Backward] = []
    if getattr(model, "automatic_optimization", True) is False:
        with own_optimizers(model, backwards, toggle):
            model.training_step(batch, 0)  # type: ignore[operator]
        if not backwards:
            raise TypeError("training_step with manual optimization called no manual_backward")
        return backwards
    if hasattr(model, "training_step"):
        loss = loss_of(model.training_step(batch, 0))
    else:
        args = batch if isinstance(batch, tuple | list) else (batch,)
        loss = model(*args).float().sum()
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
    return [Backward(loss.detach(), grads)]


def measured_step(model: nn.Module, batch: Any) -> list[Backward]:
    """`training_step` as the memory measure runs it: MemTracker hooks the gradient of
    every parameter, which one that a manual step toggled off refuses, so nothing is
    toggled (the backward differs by those weights' own gradients, not counted here)."""
    return training_step(model, batch, toggle=False)


def _tracked_peak(model: nn.Module, batch: Any, step: Callable, autocast: torch.dtype | None):
    """Activations, temporaries and the batch at the peak of forward + backward, as
    MemTracker's snapshot of that moment has them (bytes, on the step's device)."""
    model.train()
    tracker, kinds = memory_tracker()  # kinds: activations, temporaries, the batch
    tracker.track_external(model, *_tensors(batch))

    # MemTracker refuses a module called again outside any other module's forward (a
    # GAN's discriminator, on real then generated samples, straight from the step)
    # unless its figures are gone: that module's are dropped (not every module's, which
    # a backward still to come may read). The step's peak, all that is read here, is
    # kept. `depth` counts the forwards running.
    depth = [0]

    def entered(module: nn.Module, args: Any) -> None:
        if depth[0] == 0 and module in tracker.memory_tracking:
            forget_module(tracker, module)
        depth[0] += 1

    def left(module: nn.Module, args: Any, output: Any) -> None:
        depth[0] -= 1

    context = torch.autocast("cpu", dtype=autocast) if autocast else nullcontext()
    hooks = (  # before the tracker's own
        register_module_forward_pre_hook(entered),
        register_module_forward_hook(left, always_call=True),
    )
    try:
        with warnings.catch_warnings(), tracker:
            warnings.simplefilter("ignore")  # self.log without a Trainer, and the like
            with context:
                step(model, batch)  # and its backward passes
    finally:
        for hook in hooks:
            hook.remove()
    snapshot = tracker.get_tracker_snapshot("peak")
    return sum(device.get(kind, 0) for device in snapshot.values() for kind in kinds)


def _tensors(batch: Any) -> list[torch.Tensor]:
    tensors: list[torch.Tensor] = []
    apply_to_collection(batch, torch.Tensor, tensors.append)
    return tensors


def _map_tensors(fn: Callable[[torch.Tensor], Any], batch: Any) -> Any:
    return apply_to_collection(batch, torch.Tensor, fn)


@dataclass
class Activations:
    bytes: int | None
    method: str  # how it was measured, as the table says it


def measure_activations(
    meta_model: nn.Module,
    batch: Any,
    batch_size: int,
    precision: str = "32-true",
    step: Callable[[nn.Module, Any], Any] = measured_step,
) -> Activations:
    """The activation peak of one training step of `batch` (`batch_size` samples):
    on fake tensors first (torch's FakeTensorMode: shapes only, no memory, no
    compute), else one real CPU step of a tiny slice of the batch, scaled."""
    weights, autocast = PRECISIONS[precision]
    try:
        peak = _fake_peak(meta_model, batch, step, weights, autocast)
        return Activations(peak, "peak of one step, fake tensors")
    except Exception as error:  # an op fake tensors cannot run (data-dependent shapes)
        why = short(error)
    weight_bytes = sum(p.numel() * (weights or p.dtype).itemsize for p in meta_model.parameters())
    if weight_bytes > REAL_STEP_LIMIT:
        return Activations(
            None,
            f"not measured: fake tensors failed ({why}), and a real step would take"
            f" {human(2 * weight_bytes)} of host memory for weights and gradients",
        )
    try:
        tiny = min(TINY_BATCH, batch_size)
        peak = _real_peak(meta_model, _sliced(batch, batch_size, tiny), step, weights, autocast)
        scaled = round(peak * batch_size / tiny)
        return Activations(
            scaled,
            f"peak of one real CPU step of batch {tiny}, x{batch_size / tiny:g}"
            f" (fake tensors failed: {why})",
        )
    except Exception as error:
        return Activations(None, f"not measured: the step failed ({short(error)})")


def _fake_peak(model, batch, step, weights, autocast) -> int:
    # Real tensors allowed: to_empty copies the meta weights, and a model may hold
    # real constant tensors; both become fake as they enter an op.
    model = _meta_copy(model, weights)  # (outside the mode: fake tensors do not deep-copy)
    with fake_tensor_mode() as mode:
        model = model.to_empty(device="cpu")
        fake = _map_tensors(lambda t: _on_cpu(mode.from_tensor(t), t, weights), batch)
        return _tracked_peak(model, fake, step, autocast)


def _meta_copy(model: nn.Module, weights: torch.dtype | None) -> nn.Module:
    """A copy of the (meta) model to run, its weights in `weights` (true-half precision).

    Its frozen weights become buffers: MemTracker hooks the gradient of every parameter,
    and a frozen one takes no hook; a frozen weight's step is the same either way."""
    model = copy.deepcopy(model)
    for module in model.modules():
        for name, parameter in list(module.named_parameters(recurse=False)):
            if not parameter.requires_grad:
                delattr(module, name)
                module.register_buffer(name, parameter.detach(), persistent=False)
    return model.to(weights) if weights is not None else model


def short(error: BaseException) -> str:
    """An error in a few words: its type and the first line of its message, cut."""
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first[:80]}" if first else type(error).__name__


def _on_cpu(fake: torch.Tensor, source: torch.Tensor, weights: torch.dtype | None):
    if source.device.type == "meta":
        fake = torch.empty(source.shape, dtype=source.dtype)
    if weights is not None and fake.is_floating_point():
        fake = fake.to(weights)  # as Lightning's true-half precision casts the batch
    return fake


def _real_peak(model, batch, step, weights, autocast) -> int:
    model = _meta_copy(model, weights).to_empty(device="cpu")
    with torch.no_grad():
        for module in model.modules():  # values to compute with, not uninitialised memory
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
    if weights is not None:
        batch = _map_tensors(lambda t: t.to(weights) if t.is_floating_point() else t, batch)
    batch = _map_tensors(lambda t: t.to("cpu"), batch)
    return _tracked_peak(model, batch, step, autocast)


def _sliced(batch: Any, batch_size: int, size: int) -> Any:
    """The first `size` samples of every tensor whose first dimension is the batch."""
    return _map_tensors(lambda t: t[:size] if t.dim() and t.shape[0] == batch_size else t, batch)


def batch_size_of(batch: Any, loader: Any = None, datamodule: Any = None) -> int:
    """The per-device batch: the loader's, else the DataModule's, else the batch's length."""
    for source in (loader, datamodule):
        size = getattr(source, "batch_size", None)
        if isinstance(size, int) and size > 0:
            return size
    tensors = _tensors(batch)
    return int(tensors[0].shape[0]) if tensors and tensors[0].dim() else 1


# The GPUs ------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    name: str
    free: int
    total: int | None = None


def visible_gpus() -> list[Gpu]:
    """Free and total memory of each visible CUDA device, by torch.cuda.mem_get_info."""
    if not torch.cuda.is_available():
        return []
    gpus = []
    for index in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(index)
        gpus.append(Gpu(f"cuda:{index}", int(free), int(total)))
    return gpus


def given_gpus(free_gib: float, count: int) -> list[Gpu]:
    """`count` GPUs with `free_gib` GiB free each (--devices_free_gib)."""
    if not free_gib > 0:
        raise ValueError(f"--devices_free_gib {free_gib:g}: must be above 0 (GiB free per GPU)")
    return [Gpu(f"cuda:{index}", int(free_gib * GIB)) for index in range(count)]


def describe_gpus(gpus: Sequence[Gpu], given: bool) -> str:
    if not gpus:
        return "GPUs: none visible (torch.cuda.is_available() is False)"
    if given:
        return f"GPUs: {len(gpus)} x {human(gpus[0].free)} free each (given: --devices_free_gib)"
    return "GPUs: " + " | ".join(
        f"{g.name} {human(g.free)} free" + (f" of {human(g.total)}" if g.total else "")
        for g in gpus
    )


# The plan --------------------------------------------------------------------------


@dataclass
class Plan:
    """Everything `doctor --memory` prints."""

    world_size: int
    batch_size: int | None
    optimizer: str
    weights: str  # "fp32 master weights", "bf16 weights"
    precision: str
    ddp: PerRank
    fsdp: PerRank
    method: str
    gpus: list[Gpu]
    given: bool
    kind: str
    advice: str
    counted: str
    parameter_count: int
    notes: list[str] = field(default_factory=list)
    headroom: float = HEADROOM


def plan(
    model: nn.Module,
    world_size: int,
    gpus: Sequence[Gpu],
    activations: Activations,
    batch_size: int | None = None,
    precision: str = "32-true",
    optimizers: Sequence[torch.optim.Optimizer] | None = None,
    optimizer_note: str | None = None,
    given: bool = False,
) -> Plan:
    """The per-rank figures of `model` (meta, or any device) and the verdict."""
    check_world_size(world_size)
    weight_dtype, autocast = PRECISIONS[precision]
    params, buffers, facts = params_of(model, optimizers, weight_dtype)
    ddp = per_rank(params, world_size, False, buffers, activations.bytes)
    fsdp = per_rank(params, world_size, True, buffers, activations.bytes)
    needed = None
    if gpus and activations.bytes is not None:
        budget = int(min(g.free for g in gpus) * (1 - HEADROOM))
        needed = smallest_fitting_world_size(params, budget, buffers, activations.bytes)
    kind, advice = verdict(ddp, fsdp, [g.free for g in gpus], world_size, HEADROOM, needed)
    held = {weight_dtype or p.dtype for p in model.parameters() if p.is_floating_point()}
    width = " + ".join(sorted(DTYPE_NAMES.get(d, str(d)) for d in held)) or "fp32"
    weights = f"{width} master weights" if autocast else f"{width} weights"
    gathered = "FSDP's gathered copy of the block in flight"
    if autocast is not None:
        gathered += f" ({DTYPE_NAMES[autocast]})"  # mixed precision gathers in that dtype
    counted = (
        "counted: gradients and optimizer state in the weights' dtype; FSDP: ceil(dim0/world"
        f" size) rows of each parameter a rank, buffers whole. Not counted: {gathered},"
        " communication buffers, the optimizer step's temporaries"
    )
    notes = [n for n in (optimizer_note, facts.note) if n]
    return Plan(
        world_size=world_size,
        batch_size=batch_size,
        optimizer=facts.name,
        weights=weights,
        precision=precision,
        ddp=ddp,
        fsdp=fsdp,
        method=activations.method,
        gpus=list(gpus),
        given=given,
        kind=kind,
        advice=advice,
        counted=counted,
        parameter_count=sum(math.prod(p.shape) for p in params),
        notes=notes,
    )


def format_plan(p: Plan) -> str:
    batch = f"per-device batch {p.batch_size}" if p.batch_size else "batch unknown"
    header = (
        f"memory per rank (planned world size {p.world_size}, {batch}, {p.optimizer},"
        f" {p.weights}, precision {p.precision}; {p.parameter_count:,} parameters):"
    )
    rows = [
        ("parameters", p.ddp.parameters, p.fsdp.parameters, ""),
        ("gradients", p.ddp.gradients, p.fsdp.gradients, ""),
        ("optimizer state", p.ddp.optimizer_state, p.fsdp.optimizer_state, ""),
        ("activations", p.ddp.activations, p.fsdp.activations, f"({p.method})"),
        ("total", p.ddp.total, p.fsdp.total, ""),
    ]
    lines = [header, f"{'':18}{'DDP':>14}{'FSDP':>14}"]  # wide enough for "not measured"
    for name, ddp, fsdp, note in rows:
        lines.append(f"{name:18}{human(ddp):>14}{human(fsdp):>14}   {note}".rstrip())
    lines += [f"note: {note}" for note in p.notes]
    lines += [
        p.counted,
        describe_gpus(p.gpus, p.given),
        f"verdict: {p.advice}",
    ]
    return "\n".join(lines)


def plan_json(p: Plan) -> dict[str, Any]:
    """The plan as plain values, bytes throughout."""
    figures = {}
    for name, rank in (("ddp", p.ddp), ("fsdp", p.fsdp)):
        figures[name] = {**asdict(rank), "total": rank.total}
    return {
        "world_size": p.world_size,
        "batch_size": p.batch_size,
        "parameter_count": p.parameter_count,
        "optimizer": p.optimizer,
        "weights": p.weights,
        "precision": p.precision,
        **figures,
        "activations_method": p.method,
        "gpus": [asdict(g) for g in p.gpus],
        "free_memory_given": p.given,
        "headroom": p.headroom,
        "verdict": p.kind,
        "advice": p.advice,
        "counted": p.counted,
        "notes": p.notes,
    }


# doctor --memory -----------------------------------------------------------------


class MemoryPlanError(ValueError):
    """A memory estimate that cannot be made as asked; the message says why."""


@dataclass
class Built:
    """The project's model on the meta device, its DataModule and the run's precision,
    as `fit` would configure them (kit/doctor.py builds them with the CLI)."""

    model: nn.Module
    datamodule: Any
    precision: str
    notes: list[str] = field(default_factory=list)


def configure_model(model: nn.Module) -> None:
    """The layers a LightningModule builds in `configure_model` (as models too big for
    one device do), built as the Trainer would, here on the meta device."""
    hook = getattr(model, "configure_model", None)
    if callable(hook):
        hook()


def first_batch(datamodule: Any) -> tuple[Any, int]:
    """One training batch of the DataModule (setup("fit") with no Trainer: on the CPU)
    and the per-device batch size."""
    datamodule.setup("fit")
    loader = datamodule.train_dataloader()
    batch = next(iter(loader))
    return batch, batch_size_of(batch, loader, datamodule)


def estimate(
    build: Callable[[], Built],
    world_size: int | None = None,
    free_gib: float | None = None,
    precision: str | None = None,
) -> Plan:
    """`doctor --memory`'s plan for what `build` makes; `free_gib` in place of this
    machine's GPUs (tests, and planning for other machines). The values are checked
    before anything is built; a ValueError's message names the one it refused."""
    if world_size is not None:
        check_world_size(world_size)
    if precision is not None and precision not in PRECISIONS:
        raise MemoryPlanError(f"--precision {precision}: expected one of {', '.join(PRECISIONS)}")
    gpus = visible_gpus()
    planned = world_size or len(gpus) or 1
    if free_gib is not None:
        gpus = given_gpus(free_gib, planned)
    built = build()
    if precision is None and built.precision not in PRECISIONS:
        built.notes.append(f"precision {built.precision}: not one the kit plans for; 32-true")
    precision = precision or (built.precision if built.precision in PRECISIONS else "32-true")
    optimizers, why = optimizers_of(built.model)
    note = f"{why}: {ASSUMED_OPTIMIZER} assumed" if why else None
    try:
        batch, batch_size = first_batch(built.datamodule)
    except Exception as error:
        batch_size = getattr(built.datamodule, "batch_size", None)
        activations = Activations(
            None,
            f"not measured: no batch from the DataModule ({short(error)})",
        )
    else:
        activations = measure_activations(built.model, batch, batch_size, precision)
    result = plan(
        built.model,
        planned,
        gpus,
        activations,
        batch_size,
        precision,
        optimizers,
        note,
        given=free_gib is not None,
    )
    result.notes[:0] = built.notes
    return result
