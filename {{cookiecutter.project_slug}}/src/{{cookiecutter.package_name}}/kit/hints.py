"""What the classic GPU-training errors mean, and what to do next.

`HINTS` is the one table: the CLI prints the matching entry after a traceback,
and the troubleshooting table of docs/troubleshooting.md is generated from it
(`python -m <package>.kit.hints <command>` prints it; a test keeps them equal).
Plain Python: no Lightning import, so it works when Lightning's install does not.
"""

import os
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Stands for the console command in the table; `explain` and `markdown_table` put
# the project's in its place.
COMMAND = "<command>"


@dataclass(frozen=True)
class Hint:
    symptom: str  # what the error says, as the docs show it
    pattern: str  # regex over "ExceptionType: message" and its causes
    meaning: str
    causes: tuple[str, ...]  # most likely first
    fixes: tuple[str, ...]  # concrete commands or flags
    details: Callable[[dict[str, Any]], list[str]] = field(default=lambda context: [])


def _oom_details(context: dict[str, Any]) -> list[str]:
    batch = context.get("batch_size")
    precision = context.get("precision") or "32-true"
    accumulate = context.get("accumulate_grad_batches") or 1
    sampler = context.get("batch_sampler")
    if sampler:  # a batch sampler of yours sizes each batch (data.batch_size: not these)
        return [
            f"In use: batches as {sampler} makes them, --trainer.precision {precision},"
            f" --trainer.accumulate_grad_batches {accumulate}.",
            f"Try: batches half the size from {sampler}, --trainer.accumulate_grad_batches"
            f" {accumulate * 2} (same effective batch, half the activations)",
        ]
    if not batch:
        return []
    half = max(1, batch // 2)
    lines = [
        f"In use: --data.batch_size {batch} per device, --trainer.precision {precision},"
        f" --trainer.accumulate_grad_batches {accumulate}.",
        f"Try: --data.batch_size {half} --trainer.accumulate_grad_batches {accumulate * 2}"
        " (same effective batch, half the activations)",
    ]
    if not str(precision).startswith(("bf16", "16")):
        lines.append("  and/or --trainer.precision bf16-mixed (16-mixed before Ampere).")
    return lines


def _device_details(context: dict[str, Any]) -> list[str]:
    where = context.get("tensor_devices")
    if not where:
        return []
    return ["Where the module's tensors were when it failed:"] + [
        f"  {device}: {', '.join(names)}" for device, names in sorted(where.items())
    ]


def _ordinal_details(context: dict[str, Any]) -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return [
        f"Requested: --trainer.devices {context.get('devices', '?')};"
        f" visible: {context.get('cuda_device_count', '?')} device(s);"
        f" CUDA_VISIBLE_DEVICES={visible!r}" + (" (unset)" if visible is None else ""),
    ]


HINTS: tuple[Hint, ...] = (
    Hint(
        symptom="CUDA out of memory",
        pattern=r"CUDA out of memory|OutOfMemoryError",
        meaning="The GPU has no room left for this step's activations, gradients and states.",
        causes=(
            "the per-device batch is too big for the model's activations",
            "tensors kept across steps (outputs or losses collected in a list keep their graph)",
            "gradients never cleared in a hand-written loop (Lightning's own loop clears them)",
            "fragmentation from mixing NumPy and CUDA tensors back and forth",
        ),
        fixes=(
            "halve `--data.batch_size` and double `--trainer.accumulate_grad_batches`",
            "`--trainer.precision bf16-mixed` (or `16-mixed` before Ampere)",
            "`torch.cuda.empty_cache()` is no cure: it frees only cached blocks, never memory"
            " that live tensors hold",
        ),
        details=_oom_details,
    ),
    Hint(
        symptom="Expected all tensors to be on the same device",
        pattern=r"Expected all tensors to be on the same device"
        r"|Tensor on device \S+ is not on the expected device",
        meaning="One operation mixed tensors from two devices (typically cuda:0 and cpu).",
        causes=(
            "a tensor made inside forward without a device (`torch.zeros(n)` lands on the CPU)",
            "a tensor attribute of the module that is not a registered buffer, so `.to()`"
            " never moved it",
            "a batch or target moved by hand, or built in `collate_fn` on another device",
        ),
        fixes=(
            "make tensors from existing ones: `x.new_zeros(...)`,"
            " `torch.zeros(..., device=x.device)`",
            "store constants with `self.register_buffer(...)`",
            "run `pytest tests/kit/test_model.py`: the meta-device test finds the line on a CPU",
        ),
        details=_device_details,
    ),
    Hint(
        symptom="CUDA driver version is insufficient for CUDA runtime version",
        pattern=r"driver version is insufficient",
        meaning="The NVIDIA driver is older than the CUDA runtime this torch was built with.",
        causes=("torch built for a newer CUDA than the driver supports (`nvidia-smi`, top right)",),
        fixes=(
            "upgrade the NVIDIA driver",
            "or install a torch built for the CUDA version the driver reports",
            f"`{COMMAND} doctor` shows both versions",
        ),
    ),
    Hint(
        symptom="libcudnn...: cannot open shared object file",
        pattern=r"libcudnn\S*: cannot open shared object file",
        meaning="torch cannot load cuDNN, the library behind its convolutions on the GPU.",
        causes=(
            "an incomplete or mixed install (conda and pip both installed CUDA libraries)",
            "a `LD_LIBRARY_PATH` that points at another CUDA's libraries",
        ),
        fixes=(
            "reinstall torch in a clean environment with the command from pytorch.org",
            "do not mix conda and pip for torch and CUDA packages",
        ),
    ),
    Hint(
        symptom="invalid device ordinal",
        pattern=r"invalid device ordinal",
        meaning="The run asked for a GPU index that this process cannot see.",
        causes=(
            "`--trainer.devices` asks for more GPUs (or a higher index) than are visible",
            "`CUDA_VISIBLE_DEVICES` hides the GPUs the run names",
        ),
        fixes=(
            "`--trainer.devices` at most the number of visible GPUs (`-1` for all of them)",
            "check `CUDA_VISIBLE_DEVICES`: `CUDA_VISIBLE_DEVICES=0` leaves only GPU 0, as `cuda:0`",
        ),
        details=_ordinal_details,
    ),
    Hint(
        symptom="`CUDAAccelerator` can not run on your system / No supported gpu backend found",
        pattern=r"Accelerator` can not run on your system|No supported gpu backend found",
        meaning="The run asked for an accelerator this machine or this torch build cannot use.",
        causes=(
            "a CPU-only build of torch",
            "no NVIDIA driver, or one too old for this torch",
            "`CUDA_VISIBLE_DEVICES` hides every GPU",
        ),
        fixes=(
            f"`{COMMAND} doctor` says which, with the fix",
            "`--trainer.accelerator auto` uses the GPU when there is one, else the CPU",
        ),
    ),
    Hint(
        symptom="SyncBatchNorm layers only work with GPU modules",
        pattern=r"SyncBatchNorm layers only work with GPU modules",
        meaning="SyncBatchNorm needs CUDA; this run is on CPUs.",
        causes=(
            "`nn.SyncBatchNorm` built or converted in the model's own code",
            "(`--trainer.sync_batchnorm true` is switched off by the CLI where there is no CUDA)",
        ),
        fixes=(
            "build plain `nn.BatchNorm*d` and let the trainer convert them:"
            " `--trainer.sync_batchnorm true`, which takes effect on CUDA only",
        ),
    ),
    Hint(
        symptom="the rendezvous port is already taken (EADDRINUSE)",
        pattern=r"EADDRINUSE|[Aa]ddress already in use",
        meaning="Rank 0 could not listen on MASTER_PORT: another process on this machine"
        " (another job, or this one still running) holds it.",
        causes=(
            "`MASTER_PORT` set in the shell or job script to a port another job uses",
            "an earlier run of the same command still running, or not yet ended",
        ),
        fixes=(
            "unset `MASTER_PORT` on one machine: the kit picks a free port",
            "or choose another: `MASTER_PORT=29511`; `ss -ltnp` shows who holds a port",
        ),
    ),
    Hint(
        symptom="NCCL/gloo timeout or connection error between ranks",
        pattern=r"DistNetworkError|DistStoreError|Timed out initializing process group"
        r"|TCPStore.*([Tt]imed out|[Tt]imeout|refused)|gloo.*[Tt]imed out|Socket Timeout"
        r"|Connection closed by peer"
        r"|NCCL error|Watchdog caught collective operation timeout",
        meaning="The ranks could not all meet or lost each other: some never started,"
        " cannot reach rank 0, or died; or a collective they all entered never completes.",
        causes=(
            "world size mismatch: `--trainer.num_nodes` x `--trainer.devices` differs from the"
            " processes actually started",
            "a stray `NODE_RANK`, `LOCAL_RANK`, `WORLD_SIZE` or `MASTER_ADDR` in the shell, from"
            " an earlier job: Lightning reads them and waits for ranks that never come",
            "`MASTER_ADDR`/`MASTER_PORT` unreachable from other nodes (firewall, wrong address)",
            "NCCL's peer-to-peer path broken on this machine's PCIe topology (an all-reduce"
            " that hangs on some machines only)",
            "NCCL or gloo bound to the wrong network interface",
            "a rank crashed (before init or mid-run); its own log has the first error",
        ),
        fixes=(
            f"`{COMMAND} doctor --distributed` forms a group on this machine and names what is"
            " wrong",
            "start the same command on every node with the same `MASTER_ADDR` and `MASTER_PORT`;"
            " unset `NODE_RANK`, `LOCAL_RANK`, `WORLD_SIZE` outside a launcher",
            "`NCCL_P2P_DISABLE=1` where an all-reduce hangs on one machine;"
            " `NCCL_IB_DISABLE=1` where InfiniBand does not work",
            "`NCCL_DEBUG=INFO` shows what NCCL tried; pin the interface with"
            " `NCCL_SOCKET_IFNAME`/`GLOO_SOCKET_IFNAME`",
            "`--distributed.timeout SECONDS` ends a stalled job sooner, naming the rank that"
            " did not arrive",
        ),
    ),
    Hint(
        symptom="parameters that were not used in producing the loss (DDP)",
        pattern=r"parameters that were not used in producing the loss"
        r"|Expected to have finished reduction in the prior iteration",
        meaning="Under DDP, a step's backward left some parameters without a gradient,"
        " and DDP waits for every gradient before it averages them.",
        causes=(
            "a layer that a step skips (a branch taken only sometimes, an unused head)",
            "parameters frozen or detached for some steps and not for others",
            "(manual optimization, a GAN's two networks: the kit already looks for them)",
        ),
        fixes=(
            "`--trainer.strategy ddp_find_unused_parameters_true`: DDP then looks for the"
            " parameters each backward leaves out (a little slower)",
            "or remove the unused layers, or give them `requires_grad=False` for the whole run",
        ),
    ),
    Hint(
        symptom="No module named 'torch.distributed'",
        pattern=r"No module named 'torch\.distributed'|torch\.distributed is not available",
        meaning="This torch build lacks torch.distributed, which DDP needs.",
        causes=("an incomplete or unusual torch install",),
        fixes=(f"reinstall torch (faster than debugging it); `{COMMAND} doctor` checks it",),
    ),
    Hint(
        symptom="Weights only load failed ... Unsupported global",
        pattern=r"Weights only load failed",
        meaning="The checkpoint holds pickled objects besides tensors and plain values;"
        " loading it that way could run any code, so it was refused.",
        causes=(
            "a checkpoint saved with custom objects in its hyperparameters or state",
            "a file from a source you do not control",
        ),
        fixes=(
            "a checkpoint you trust can be made plain once: `torch.load(path, weights_only=False)`,"
            " replace the objects by plain values, `torch.save` it",
            "keep hyperparameters plain: `save_hyperparameters(ignore=[...])` for objects",
        ),
    ),
)


def _chain(error: BaseException | None) -> list[BaseException]:
    """The error and every error it was raised from (or while handling), outermost first."""
    chain: list[BaseException] = []
    while error is not None and all(error is not seen for seen in chain):
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain


def _error_text(error: BaseException) -> str:
    """The error and every error it was raised from, as 'Type: message' lines."""
    return "\n".join(f"{type(link).__name__}: {link}" for link in _chain(error))


def kept_context(error: BaseException) -> dict[str, Any]:
    """What the run kept with the error and those it came from (`callbacks.keep_context`); the
    innermost account, nearest the failure, wins."""
    context: dict[str, Any] = {}
    for link in _chain(error):
        context.update(getattr(link, "run_context", {}))
    return context


def find_hint(error: BaseException) -> Hint | None:
    text = _error_text(error)
    return next((h for h in HINTS if re.search(h.pattern, text)), None)


def explain(
    error: BaseException, context: dict[str, Any] | None = None, command: str = COMMAND
) -> str | None:
    """The block to print after the traceback, or None for an unknown error. `context`
    defaults to what the run kept with the error (`keep_context`)."""
    hint = find_hint(error)
    if hint is None:
        return None
    context = kept_context(error) if context is None else context
    lines = [f"Hint: {hint.symptom}", f"  What it means: {hint.meaning}", "  Likely causes:"]
    lines += [f"    {n}. {cause}" for n, cause in enumerate(hint.causes, 1)]
    lines.append("  Next:")
    lines += [f"    - {fix}" for fix in hint.fixes]
    lines += [f"  {line}" for line in hint.details(context)]
    rule = "=" * 72
    return "\n".join([rule, *lines, rule]).replace(COMMAND, command)


def markdown_table(command: str = COMMAND) -> str:
    """The troubleshooting table (docs/troubleshooting.md): symptom -> cause -> fix."""
    rows = ["| symptom | likely cause | fix |", "| --- | --- | --- |"]
    for hint in HINTS:
        cause = "; ".join(hint.causes)
        fix = "; ".join(hint.fixes)
        rows.append(f"| {hint.symptom} | {cause} | {fix} |".replace("\n", " "))
    return "\n".join(rows).replace(COMMAND, command)


# One line instead of a traceback --------------------------------------------------------

# Where a loader worker started by a fork server or spawn (Python 3.14's default on Linux)
# cannot be handed the dataset: torch shares each tensor through a file descriptor of
# its own, and one message carries a few hundred at most.
TOO_MANY_FDS = (
    "a DataLoader worker could not be handed the dataset (too many fds): it holds more"
    " tensors than a process can be sent at once. Keep its samples in a few large tensors"
    " (or NumPy arrays), or run with --data.num_workers 0 for data already in memory"
)


def one_line(error: BaseException, package: str) -> tuple[str, int] | None:
    """(the line, the exit code) for an error of the input or the machine that needs no
    traceback: a file that is not there (2), a loader worker that cannot be handed the
    dataset (1); None for any other. An error Lightning raised as it tore the run down
    may hide the one that stopped it: the chain is followed through Lightning's alone."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, FileNotFoundError):  # a data file: the input, not a bug
            return f"{seen}{raised_in(seen, package)}", 2
        if isinstance(seen, ValueError) and "too many fds" in str(seen):
            return TOO_MANY_FDS, 1
        seen = (seen.__cause__ or seen.__context__) if raised_by_lightning(seen) else None
    return None


def raised_by_lightning(error: BaseException) -> bool:
    """Whether Lightning's own code raised `error` (its innermost frame is Lightning's)."""
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and f"{os.sep}lightning{os.sep}" in frames[-1].filename


def raised_in(error: BaseException, package: str) -> str:
    """' (raised in data.py:52, in make_splits)': the line of the project's own code (the
    deepest in `package` outside its kit) the error came from, or ''."""
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if f"{os.sep}{package}{os.sep}" in frame.filename
        and f"{os.sep}kit{os.sep}" not in frame.filename
    ]
    if not frames:
        return ""
    where = frames[-1]
    return f" (raised in {os.path.basename(where.filename)}:{where.lineno}, in {where.name})"


if __name__ == "__main__":
    import sys

    print(markdown_table(*sys.argv[1:2]))
