"""Bigger than one GPU: FSDP2 (`torch.distributed.fsdp.fully_shard`) for any project.

`fit --config configs/fsdp.yaml` (or `--fsdp.enabled true`) runs Lightning's
ModelParallelStrategy with this subclass, which shards the project's network
itself, so the LightningModule needs no `configure_model`:

- each block is sharded on its own, then the other children with weights of the
  modules it wraps (so a LightningModule may call them one by one), then each of
  those modules: they are `Project.wrap`, by default every child of the
  LightningModule with weights (a GAN's generator and discriminator); the blocks
  are `Project.shard_blocks` (or `--fsdp.blocks`: class names or module paths
  with `*`), by default every repeated block (the transformer layers, say);
- on CUDA under bf16 precision the parameters are gathered in bf16 and the
  gradients reduced in fp32 (`MixedPrecisionPolicy`); `16-mixed` is refused;
- `--fsdp.activation_checkpointing true` recomputes each block's activations
  in the backward pass; `--fsdp.cpu_offload true` keeps the sharded
  parameters, gradients and optimizer state in host memory (CUDA only);
- tensor parallelism is out of the kit's scope: `--fsdp.tensor_parallel_size`
  must be 1 (write `configure_model` yourself with Lightning's strategy for it).

Checkpoints are distributed-checkpoint folders (one file of shards per rank and
`meta.pt`), written as the kit writes files: into `<name>.partial`, with a
`COMMITTED` marker written last, then renamed into place. A folder without its
marker is never resumed from; `export` and `test` consolidate the shards.
"""

import fnmatch
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, cast

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from torch.distributed import ProcessGroup

from .checkpoints import (
    PARTIAL_FOLDER,
    BackgroundWriter,
    CheckpointError,
    CheckpointSaveError,
    _save_failure,
    atomic_save,
    check_sharded,
    commit_folder,
)
from .internals import DCP_METADATA, dcp_load_full, dcp_save
from .runs import is_first_process
from .spec import ConfigError, FSDPOptions, units_of

CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def consolidate(path: str | Path) -> dict[str, Any]:
    """A sharded checkpoint folder as one ordinary Lightning checkpoint (in memory):
    `state_dict` unsharded, `optimizer_states` a list, the rest from `meta.pt`."""
    checkpoint = dcp_load_full(Path(path))
    optimizers = sorted(
        (key for key in checkpoint if key.startswith("optimizer_")), key=lambda k: int(k[10:])
    )
    if optimizers:
        checkpoint["optimizer_states"] = [checkpoint.pop(key) for key in optimizers]
    return checkpoint


def consolidated(folder: Path) -> Path:
    """A sharded checkpoint folder's shards joined into one ordinary checkpoint file,
    `consolidated.ckpt` inside the folder (written once, atomically: the folder itself
    never changes after its commit, and goes with it)."""
    target = Path(folder) / "consolidated.ckpt"
    if not target.is_file() and is_first_process():
        atomic_save(consolidate(folder), target)
        rank_zero_info(f"Joined the shards of {folder} into {target.name} inside it")
    return target


def find_blocks(units: Sequence[nn.Module], names: Sequence[str] | None = None) -> list[nn.Module]:
    """The submodules of `units` (the modules FSDP wraps) to shard one by one, outermost first.

    `names`: class names or module paths from a unit (fnmatch patterns such as
    "layers.*"); each must match something. None: in each unit, every module whose
    class it holds several instances of with weights (repeated blocks), outside the
    containers and inside no other such block.
    """
    if not names and len(units) != 1:
        return [block for unit in units for block in find_blocks([unit])]
    modules = [(name, m) for unit in units for name, m in unit.named_modules() if name]
    if names:
        chosen = []
        for entry in names:
            matched = [
                (name, module)
                for name, module in modules
                if type(module).__name__ == entry or fnmatch.fnmatchcase(name, entry)
            ]
            if not matched:
                classes = sorted({type(m).__name__ for _, m in modules if _has_weights(m)})
                raise ConfigError(
                    f"fsdp.blocks: {entry!r} matches no module of"
                    f" {', '.join(type(unit).__name__ for unit in units)}"
                    f" (its classes with weights: {', '.join(classes) or 'none'})"
                )
            chosen += matched
        return _outermost(chosen)
    counts: dict[type, int] = {}
    for _, module in modules:
        if _is_block(module):
            counts[type(module)] = counts.get(type(module), 0) + 1
    repeated = [(n, m) for n, m in modules if _is_block(m) and counts[type(m)] > 1]
    return _outermost(repeated)


def _has_weights(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def _is_block(module: nn.Module) -> bool:
    """A module of several layers with weights: not a leaf, not a container."""
    return (
        not isinstance(module, CONTAINERS)
        and any(True for _ in module.children())
        and _has_weights(module)
    )


def _outermost(named: Iterable[tuple[str, nn.Module]]) -> list[nn.Module]:
    chosen: list[nn.Module] = []
    for _, module in sorted(named, key=lambda item: item[0].count(".")):
        inside = any(module is inner for outer in chosen for inner in outer.modules())
        if not inside:
            chosen.append(module)
    return chosen


def find_parts(network: nn.Module, blocks: Sequence[nn.Module]) -> list[nn.Module]:
    """The network's children that hold weights outside `blocks`, each sharded as a
    unit of its own (the embedding, the head): a LightningModule may call them one by
    one rather than through the network's forward, and FSDP gathers a unit's weights
    only when that unit's forward runs. A child sharing a weight with another (tied
    embedding and head) stays with the network, since a weight belongs to one unit."""
    in_blocks = {id(p) for block in blocks for p in block.parameters()}
    owners: dict[int, int] = {}
    children = [child for child in network.children() if all(child is not b for b in blocks)]
    for child in children:
        for parameter in {id(p) for p in child.parameters()}:
            owners[parameter] = owners.get(parameter, 0) + 1
    return [
        child
        for child in children
        if any(id(p) not in in_blocks for p in child.parameters())
        and all(owners[id(p)] == 1 for p in child.parameters())
    ]


def checkpoint_activations(block: nn.Module) -> None:
    """Recompute `block`'s forward in the backward pass (torch.utils.checkpoint), in place:
    its parameter names are unchanged, unlike with a wrapper module."""
    from torch.utils.checkpoint import checkpoint

    forward = block.forward

    def recomputed(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    block.forward = recomputed  # type: ignore[method-assign]


class FSDP2Strategy(ModelParallelStrategy):
    """Lightning's ModelParallelStrategy that shards the project's network itself.

    Lightning's strategy requires the LightningModule to shard itself in
    `configure_model`; this one does it for any module, after the module's own
    `configure_model` if it has one, and writes checkpoints that a kill cannot
    leave half-written.
    """

    def __init__(
        self,
        options: FSDPOptions | None = None,
        wrap: Sequence[str] | None = None,
        blocks: Sequence[str] | None = None,
        **kwargs,
    ):
        options = options or FSDPOptions(enabled=True)
        if options.tensor_parallel_size != 1:
            raise ConfigError(
                f"fsdp.tensor_parallel_size={options.tensor_parallel_size}: the kit shards"
                " over data-parallel ranks only (1); for tensor parallelism write"
                " configure_model with Lightning's ModelParallelStrategy yourself"
            )
        if options.data_parallel_size is not None and options.data_parallel_size < 1:
            raise ConfigError(
                f"fsdp.data_parallel_size={options.data_parallel_size}: must be 1 or more"
            )
        super().__init__(
            data_parallel_size=options.data_parallel_size or "auto",
            tensor_parallel_size=1,
            save_distributed_checkpoint=True,
            **kwargs,
        )
        self.options = options
        self.wrap = wrap  # Project.wrap
        self.blocks = options.blocks if options.blocks is not None else blocks  # or the project's
        self.sharded_blocks = 0
        # The background saves' gloo group, made at the first of them.
        self._save_group: ProcessGroup | None = None

    def setup_environment(self) -> None:
        if self._data_parallel_size == "auto":  # Lightning's "auto" is one per node
            self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()
        module = self.lightning_module
        assert module is not None  # connected before the strategy sets up
        own = getattr(type(module), "configure_model", None)

        def configure_model() -> None:
            if own is not None:
                own(module)
            self.shard(module)

        # Lightning calls the module's configure_model (an instance attribute wins) and
        # refuses to start unless it is overridden: here it is, by the strategy.
        module.configure_model = configure_model

    def teardown(self) -> None:
        module = self.lightning_module
        if module is not None and "configure_model" in vars(module):
            del module.configure_model
        try:
            self.checkpoint_io.teardown()  # the save in flight (Lightning's does not call it)
        finally:
            if self._save_group is not None:
                torch.distributed.destroy_process_group(self._save_group)
                self._save_group = None
            super().teardown()

    def precision_policy(self) -> Any:
        """bf16 parameters, fp32 gradient reduction on CUDA under bf16; else None."""
        precision = str(getattr(self.precision_plugin, "precision", "32-true"))
        if precision.startswith("16") and self.root_device.type == "cuda":
            raise ConfigError(
                f"trainer.precision={precision} with FSDP: fp16 needs a sharded gradient"
                " scaler the kit does not set up; use bf16-mixed (Ampere or newer) or 32-true"
            )
        if not precision.startswith("bf16") or self.root_device.type != "cuda":
            return None
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)

    def shard(self, module: nn.Module) -> None:
        """fully_shard the blocks of the modules FSDP wraps (`Project.wrap`), their other
        parts, then each of those modules."""
        from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, fully_shard

        units = units_of(module, self.wrap)
        if any(isinstance(unit, FSDPModule) for unit in units):
            return  # sharded by an earlier stage of this Trainer
        held = {id(p) for unit in units for p in unit.parameters()}
        outside = [name for name, p in module.named_parameters() if id(p) not in held]
        if outside:
            raise ConfigError(
                f"fsdp: {type(module).__name__} has weights outside the modules it shards"
                f" ({', '.join(outside[:3])}): keep them in submodules, or name the"
                " submodules that hold every weight as Project.wrap in project.py"
            )
        options = self.options
        kwargs: dict[str, Any] = {
            "mesh": self.device_mesh["data_parallel"],
            "reshard_after_forward": options.reshard_after_forward,
        }
        policy = self.precision_policy()
        if policy is not None:
            kwargs["mp_policy"] = policy
        if options.cpu_offload:
            if self.root_device.type == "cuda":
                kwargs["offload_policy"] = CPUOffloadPolicy()
            else:
                rank_zero_info("fsdp.cpu_offload: ignored, the parameters are on the CPU already")
        blocks = find_blocks(units, self.blocks)
        for block in blocks:
            if options.activation_checkpointing:
                checkpoint_activations(block)
            fully_shard(block, **kwargs)
        parts = [part for unit in units for part in find_parts(unit, blocks)]
        for part in parts:
            fully_shard(part, **kwargs)
        for unit in units:
            fully_shard(unit, **kwargs)
        self.sharded_blocks = len(blocks)
        what = f"{len(blocks)} {type(blocks[0]).__name__} blocks, " if blocks else ""
        what += f"{len(parts)} other parts and " if parts else ""
        names = ", ".join(type(unit).__name__ for unit in units)
        rank_zero_info(
            f"fsdp: sharded {what}{names} over {kwargs['mesh'].size()} ranks"
            + (" (bf16 parameters, fp32 reduction)" if policy is not None else "")
            + (", activations recomputed per block" if options.activation_checkpointing else "")
        )

    def sync_buffers(self) -> None:
        """Every rank takes rank 0's buffers (BatchNorm statistics), as DDP does: each
        rank's evaluation and the checkpoint then agree, and a resume is exact."""
        if self.world_size < 2 or self.model is None:
            return
        for buffer in self.model.buffers():
            torch.distributed.broadcast(buffer, src=0)

    def lightning_module_state_dict(self) -> dict[str, Any]:
        # Which rank's copy of an unsharded buffer a distributed checkpoint keeps is
        # not fixed: every rank holds rank 0's when the state is taken.
        self.sync_buffers()
        return super().lightning_module_state_dict()

    def on_validation_start(self) -> None:
        self.sync_buffers()
        super().on_validation_start()

    def on_test_start(self) -> None:
        self.sync_buffers()
        super().on_test_start()

    def on_predict_start(self) -> None:
        self.sync_buffers()
        super().on_predict_start()

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options=None) -> None:
        """Each rank's shards and rank 0's `meta.pt` into `<name>.partial`, then the
        COMMITTED marker, then one rename: whole or not at all. With the checkpoint
        IO's BackgroundWriter, the step waits only for the shards' copy to host memory."""
        if storage_options is not None:
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        writer = getattr(self.checkpoint_io, "writer", None)
        if writer is not None:
            writer.wait()  # the previous save is committed before another folder is begun
        path = Path(self.broadcast(str(filepath)))
        folder = path.with_name(path.name + PARTIAL_FOLDER)
        if self.is_global_zero:
            shutil.rmtree(folder, ignore_errors=True)
        self.barrier("sharded save: start")
        shards = {"state_dict": checkpoint.pop("state_dict")}
        for index, state in enumerate(checkpoint.pop("optimizer_states", [])):
            shards[f"optimizer_{index}"] = state
        if writer is not None:
            return self._save_in_background(writer, shards, checkpoint, path, folder)
        failure: str | None = None
        try:
            folder.mkdir(parents=True, exist_ok=True)
            dcp_save(shards, folder)
            if self.is_global_zero:
                atomic_save(checkpoint, folder / DCP_METADATA)
        except (OSError, CheckpointSaveError) as error:
            failure = str(error) if isinstance(error, CheckpointSaveError) else None
            failure = failure or _save_failure(path, cast(OSError, error))
        except BaseException as error:  # CheckpointException (a BaseException): every rank's
            cause = _os_error_in(error)
            if cause is None:
                raise
            failure = _save_failure(path, cause)
        failures = [failure] if self.world_size < 2 else self._gather(failure)
        failed = next((text for text in failures if text), None)
        if failed is not None:
            if self.is_global_zero:
                shutil.rmtree(folder, ignore_errors=True)
            raise CheckpointSaveError(failed)
        if self.is_global_zero:
            commit_folder(folder, path)
        self.barrier("sharded save: committed")

    def _save_in_background(
        self, writer: BackgroundWriter, shards: dict, rest: dict, path: Path, folder: Path
    ) -> None:
        """torch.distributed.checkpoint's async_save: the shards staged in the writer's host
        memory, written by its thread, whose collectives go through a gloo group of their
        own (the training's own collectives go on beside them). Once every rank's write is
        done (torch's save ends with one), rank 0 writes `meta.pt`, COMMITTED and renames."""
        from torch.distributed.checkpoint import async_save

        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise CheckpointSaveError(_save_failure(path, error)) from error
        if self._save_group is None and torch.distributed.is_initialized():
            made = torch.distributed.new_group(backend="gloo")  # every rank, at once
            # Every rank is a member, so it is a group (not torch's non-member marker).
            self._save_group = made if isinstance(made, ProcessGroup) else None
        stager, group = writer.shard_stager, self._save_group

        def copy() -> tuple[Any, dict]:
            written = async_save(
                shards, checkpoint_id=folder, process_group=group, async_stager=stager
            )
            return written, writer.stage(rest) if self.is_global_zero else {}

        written, rest = writer.timed(copy)

        def commit() -> None:
            try:
                written.result()
            except BaseException as error:
                if self.is_global_zero:
                    shutil.rmtree(folder, ignore_errors=True)
                cause = _os_error_in(error)
                if cause is None:
                    raise
                raise CheckpointSaveError(_save_failure(path, cause)) from error
            if self.is_global_zero:
                atomic_save(rest, folder / DCP_METADATA)
                commit_folder(folder, path)

        writer.run(commit)

    def _gather(self, value: Any) -> list[Any]:
        every: list[Any] = [None] * self.world_size
        torch.distributed.all_gather_object(every, value)
        return every

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        path = Path(self.broadcast(str(checkpoint_path)))
        if path.is_dir():
            problem = check_sharded(path)
            if problem:
                raise CheckpointError(f"checkpoint '{path}' is not usable: {problem}")
        return super().load_checkpoint(path, weights_only)


def _os_error_in(error: BaseException) -> OSError | None:
    """The OSError behind a distributed-checkpoint failure (it wraps each rank's)."""
    seen: set[int] = set()
    pending: list[Any] = [error]
    while pending:
        current = pending.pop()
        if id(current) in seen or current is None:
            continue
        seen.add(id(current))
        if isinstance(current, OSError):
            return current
        pending += [current.__cause__, current.__context__]
        failures = getattr(current, "failures", None)  # CheckpointException: rank -> error
        if isinstance(failures, dict):
            for value in failures.values():
                pending.append(value[0] if isinstance(value, tuple) else value)
    return None
