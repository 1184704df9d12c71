"""What a model's weights, gradients and optimizer state cost per rank, under DDP or
FSDP: the arithmetic the environment report and `doctor --memory` share, in pure
functions (`shard_numel`, `state_slots`, `per_rank`) tested against hand-calculated
figures. The activations and the plan are doctor's (memory.py)."""

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

# The optimizer assumed when `configure_optimizers` cannot be called on the meta model.
ASSUMED_OPTIMIZER = "AdamW"
# Tensors of a parameter's size each optimizer keeps per parameter, by class name,
# as torch.optim's implementations do (their scalar `step` tensors are not counted).
# Options that add one are in `state_slots`. Written out because torch.optim
# creates its state at the first step and has no way to say its size before.
STATE_SLOTS = {
    "Adam": 2,  # exp_avg, exp_avg_sq (+ max_exp_avg_sq with amsgrad)
    "AdamW": 2,
    "NAdam": 2,  # exp_avg, exp_avg_sq (mu_product is a scalar)
    "RAdam": 2,
    "Adamax": 2,  # exp_avg, exp_inf
    "Adadelta": 2,  # square_avg, acc_delta
    "Rprop": 2,  # prev, step_size
    "Adagrad": 1,  # sum
    "ASGD": 1,  # ax
    "RMSprop": 1,  # square_avg (+ momentum_buffer, + grad_avg when centered)
    "SGD": 0,  # (+ momentum_buffer with momentum)
}


def check_world_size(world_size: int) -> None:
    if world_size < 1:
        raise ValueError(
            f"--world_size {world_size}: must be 1 or more (the number of ranks: one per GPU,"
            " over every node)"
        )


def shard_numel(shape: Sequence[int], world_size: int) -> int:
    """Elements of one rank's shard of a parameter under FSDP2 (`fully_shard`).

    FSDP2 splits each parameter on dim 0 with `torch.chunk` and pads every shard
    to the first one's size: ceil(dim0 / world_size) rows a rank, on every rank
    (the last ranks hold padding). A 0-dim parameter counts as one row.
    """
    # FSDP2 computes this only inside `fully_shard`, which needs a process group.
    check_world_size(world_size)
    rows, *rest = tuple(shape) or (1,)
    return math.ceil(rows / world_size) * math.prod(rest)


def state_slots(
    kind: str, momentum: float = 0.0, amsgrad: bool = False, centered: bool = False
) -> int | None:
    """Tensors of a parameter's size and dtype that optimizer `kind` keeps per
    parameter; None for an optimizer this table does not know."""
    slots = STATE_SLOTS.get(kind)
    if slots is None:
        return None
    if kind in ("Adam", "AdamW") and amsgrad:
        slots += 1
    if kind in ("SGD", "RMSprop") and momentum:
        slots += 1
    if kind == "RMSprop" and centered:
        slots += 1
    return slots


@dataclass(frozen=True)
class Param:
    """What memory one parameter costs: its (global, unsharded) shape, the bytes of
    one element and its optimizer's state slots (it has a gradient: every weight
    trains, or may)."""

    shape: tuple[int, ...]
    itemsize: int
    slots: int = 2


@dataclass(frozen=True)
class PerRank:
    """Bytes one rank holds. `activations` None: not measured."""

    parameters: int
    gradients: int
    optimizer_state: int
    activations: int | None = None

    @property
    def states(self) -> int:
        """Parameters, gradients and optimizer state: what does not depend on the batch."""
        return self.parameters + self.gradients + self.optimizer_state

    @property
    def total(self) -> int:
        return self.states + (self.activations or 0)


def per_rank(
    params: Iterable[Param],
    world_size: int = 1,
    sharded: bool = False,
    buffer_bytes: int = 0,
    activations: int | None = None,
) -> PerRank:
    """Bytes per rank: every rank holds everything (`sharded` False: DDP, or one
    device), or a dim-0 shard of every parameter, its gradient and its optimizer
    state (`sharded`: FSDP over `world_size` data-parallel ranks). Gradients and
    state are in the parameter's dtype (as torch.optim keeps them); buffers are
    not sharded."""
    check_world_size(world_size)
    weights = grads = state = 0
    for p in params:
        numel = shard_numel(p.shape, world_size) if sharded else math.prod(p.shape)
        size = numel * p.itemsize
        weights += size
        grads += size  # every weight trains, or may (a frozen one, once unfrozen)
        state += p.slots * size
    return PerRank(weights + buffer_bytes, grads, state, activations)


def human(size: int | float | None) -> str:
    """Bytes in the binary unit that keeps 3 significant digits: '3.82 MiB'."""
    if size is None:
        return "not measured"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            if unit == "B":
                return f"{int(size)} B"
            return f"{size:.3g} {unit}" if abs(size) < 1000 else f"{size:.0f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def slots_of(optimizer: torch.optim.Optimizer) -> dict[int, int | None]:
    """State slots by id(parameter), from each parameter group's own options."""
    kind = type(optimizer).__name__
    slots: dict[int, int | None] = {}
    for group in optimizer.param_groups:
        count = state_slots(
            kind,
            momentum=group.get("momentum", 0.0) or 0.0,
            amsgrad=bool(group.get("amsgrad", False)),
            centered=bool(group.get("centered", False)),
        )
        for p in group["params"]:
            slots[id(p)] = count
    return slots


@dataclass
class OptimizerFacts:
    name: str  # "AdamW", "SGD+momentum", "AdamW (assumed)"
    note: str | None  # why it was assumed


def params_of(
    model: nn.Module,
    optimizers: Sequence[torch.optim.Optimizer] | None,
    weight_dtype: torch.dtype | None = None,
) -> tuple[list[Param], int, OptimizerFacts]:
    """(the parameters, the buffers' bytes, the optimizer) of `model`, on any device
    (meta, or sharded as DTensors: their global shapes are read). Without
    optimizers, AdamW's 2 slots are assumed for every trained parameter; an
    optimizer the table does not know also gets 2, and the name says so.
    `weight_dtype`: floating-point weights held in that dtype (bf16-true)."""
    by_param: dict[int, int | None] = {}
    for optimizer in optimizers or []:
        by_param.update(slots_of(optimizer))
    unknown = sorted(
        {type(o).__name__ for o in optimizers or [] if type(o).__name__ not in STATE_SLOTS}
    )

    def itemsize(t: torch.Tensor) -> int:
        dtype = weight_dtype if weight_dtype and t.is_floating_point() else t.dtype
        return dtype.itemsize

    # A frozen weight is counted as trained: a fine-tune may unfreeze it, and its optimizer
    # then keeps state for it as for the first group's weights (the plan is for the whole
    # run; the note says what it adds, for a base that stays frozen).
    first = next(iter(by_param.values()), 2) if optimizers else state_slots(ASSUMED_OPTIMIZER)
    params, frozen, frozen_bytes = [], 0, 0
    for p in model.parameters():
        if not optimizers:
            slots = state_slots(ASSUMED_OPTIMIZER)
        elif id(p) in by_param:  # None: an optimizer the table does not know, 2 assumed
            slots = by_param[id(p)]
            slots = 2 if slots is None else slots
        else:  # in no optimizer: none now, the first group's once unfrozen
            slots = 0 if p.requires_grad else first
        if not p.requires_grad:
            frozen += math.prod(p.shape)
            frozen_bytes += math.prod(p.shape) * itemsize(p) * (1 + (slots or 0))
        params.append(Param(tuple(p.shape), itemsize(p), slots or 0))
    buffers = sum(math.prod(b.shape) * itemsize(b) for b in model.buffers())
    names = []
    for optimizer in optimizers or []:
        name = type(optimizer).__name__
        if any(g.get("momentum") for g in optimizer.param_groups) and name in ("SGD", "RMSprop"):
            name += "+momentum"
        names.append(name)
    notes = []
    if optimizers and unknown:
        notes.append(f"{', '.join(unknown)}: state not known to the kit, 2 slots assumed as AdamW")
    if frozen:
        notes.append(
            f"{frozen:,} frozen weights counted with gradients and optimizer state"
            f" ({human(frozen_bytes)} a rank under DDP): a fine-tune may unfreeze them"
        )
    name = " + ".join(names) if optimizers else f"{ASSUMED_OPTIMIZER} (assumed)"
    return params, buffers, OptimizerFacts(name, "; ".join(notes) or None)
