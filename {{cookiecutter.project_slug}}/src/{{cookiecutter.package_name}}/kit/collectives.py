"""`doctor --distributed`: can this machine form a process group, and how fast is a
collective on it; and what in the environment breaks or slows a multi-process run.

The check starts N local ranks, each joins a group over a free port of 127.0.0.1 with
the backend a run would use (NCCL on GPUs, gloo on the CPU), then runs an all-reduce
and a broadcast and checks their values. The parent holds the timeout: whatever has not
finished by then is killed and named, so the doctor never hangs where a run would.

The findings are functions of an environment (a dict) or of the check's result, so a
test plants each one without starting a process. Problems are `{"problem", "fix"}`
dicts: what the doctor prints and what `--json` shows. Nothing here imports Lightning;
torch is imported only by the check itself.
"""

import errno
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any, cast

from .machine import free_port

TIMEOUT = 30.0
# What Lightning (and torch.distributed's env://) read as a launcher's rendezvous.
RENDEZVOUS_VARIABLES = (
    "NODE_RANK",
    "LOCAL_RANK",
    "RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)
# Who may set them: any SLURM job (its batch script sets MASTER_ADDR for the steps it
# starts), torchrun, every Kubernetes pod (a PyTorchJob's operator), mpirun.
LAUNCHERS = {
    "SLURM_JOB_ID": "a SLURM job",
    "TORCHELASTIC_RUN_ID": "torchrun",
    "KUBERNETES_SERVICE_HOST": "a Kubernetes pod",
    "OMPI_COMM_WORLD_SIZE": "mpirun",
}
# A few MB on the CPU: enough to time, still quick. On GPUs NCCL's latency would
# dominate a message that small: 64 MiB measures the links.
MESSAGE_MIB = {"gloo": 4, "nccl": 64}
ITERATIONS = 5


def problem(text: str, fix: str) -> dict[str, str]:
    return {"problem": text, "fix": fix}


def launcher(env: Mapping[str, str]) -> str | None:
    """The launcher this process runs under, by the variables it sets; None in a plain shell."""
    return next((name for marker, name in LAUNCHERS.items() if marker in env), None)


def environment(env: Mapping[str, str]) -> dict[str, str]:
    """The variables these checks read (the doctor's facts, and what `--json` shows)."""
    names = (*RENDEZVOUS_VARIABLES, *LAUNCHERS, "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE")
    return {name: env[name] for name in names if name in env}


def stray_variables(env: Mapping[str, str]) -> list[dict[str, str]]:
    """Rendezvous variables in a shell that no launcher started."""
    # A NODE_RANK left in a shell hung DDP at "initializing ddp" (CompVis/taming-transformers#12).
    found = [name for name in RENDEZVOUS_VARIABLES if name in env]
    if not found or launcher(env):
        return []
    shown = ", ".join(f"{name}={env[name]}" for name in found)
    is_, it = ("is", "it") if len(found) == 1 else ("are", "them")
    return [
        problem(
            f"{shown} {is_} set in a shell that no launcher started (no SLURM job, torchrun or"
            f" Kubernetes pod): Lightning takes {it} for a launcher's, and a multi-process fit"
            " then waits for ranks that never come.",
            f"Unset {it} (`unset {' '.join(found)}`): launchers set these for the processes"
            " they start, and a fit on one machine picks its own port.",
        )
    ]


def nccl_variables(env: Mapping[str, str]) -> list[dict[str, str]]:
    """NCCL_P2P_DISABLE and NCCL_IB_DISABLE set: what each costs."""
    found = []
    if env.get("NCCL_P2P_DISABLE", "0") not in ("", "0"):
        found.append(
            problem(
                f"NCCL_P2P_DISABLE={env['NCCL_P2P_DISABLE']}: NCCL routes GPU-to-GPU traffic"
                " through host memory instead of NVLink or PCIe peer access, so collectives"
                " between this machine's GPUs are slower (many times on NVLink).",
                "Unset it, unless `doctor --distributed` hangs without it: then peer access is"
                " broken here (PCIe ACS or the IOMMU, see NCCL's troubleshooting guide, or the"
                " driver); fix that, then unset it.",
            )
        )
    if env.get("NCCL_IB_DISABLE", "0") not in ("", "0"):
        found.append(
            problem(
                f"NCCL_IB_DISABLE={env['NCCL_IB_DISABLE']}: NCCL routes traffic between nodes"
                " over TCP sockets instead of InfiniBand or RoCE, so multi-node collectives are"
                " many times slower (one machine's GPUs are not affected).",
                "Unset it on a cluster with InfiniBand; without IB, NCCL uses sockets anyway.",
            )
        )
    return found


def hidden_devices(world_size: int, visible: int, env: Mapping[str, str]) -> list[dict[str, str]]:
    """More NCCL ranks asked for than GPUs visible (`visible` 0: a CPU check, any size)."""
    if not visible or world_size <= visible:
        return []
    value = env.get("CUDA_VISIBLE_DEVICES")
    by = "" if value is None else f" (CUDA_VISIBLE_DEVICES={value!r})"
    more = "" if value is None else ", or list more GPUs in CUDA_VISIBLE_DEVICES (or unset it)"
    return [
        problem(
            f"--world_size {world_size} asks for {world_size} GPUs, but {visible} are visible"
            f"{by}: NCCL needs a GPU of its own for each rank.",
            f"Pass --world_size {visible} or fewer{more}.",
        )
    ]


def port_in_use(port: int) -> bool:
    """Something on this machine holds `port` (a rank 0 could not listen on it)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as error:
            return error.errno == errno.EADDRINUSE
    return False


def taken_port(
    env: Mapping[str, str], in_use: Callable[[int], bool] = port_in_use
) -> list[dict[str, str]]:
    """MASTER_PORT that is no port, or one something already listens on."""
    value = env.get("MASTER_PORT")
    if value is None:
        return []
    fix = (
        "Unset it (`unset MASTER_PORT`): the kit picks a free port for a run on one machine;"
        " for several, choose a port nothing listens on."
    )
    if not value.isdigit() or not 0 < int(value) < 65536:
        return [problem(f"MASTER_PORT={value!r} is not a port number.", fix)]
    if not in_use(int(value)):
        return []
    return [
        problem(
            f"MASTER_PORT={value} is taken: something on this machine listens on it, so rank 0"
            " of a run cannot open its rendezvous there.",
            fix,
        )
    ]


def _named(ranks: Iterable[int]) -> str:
    ranks = list(ranks)
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def outcome(result: dict[str, Any], command: str = "doctor") -> list[dict[str, str]]:
    """What went wrong in a check that ran: ranks that did not arrive, failed, hung, or
    computed wrong values."""
    timeout, nccl, errors = result["timeout_s"], result["backend"] == "nccl", result["errors"]
    if result["missing"]:
        missing, arrived = result["missing"], result["arrived"]
        them = "it" if len(missing) == 1 else "them"
        waited = f"; {_named(arrived)} waited for {them}" if arrived else ""
        died = "".join(f"; rank {r}: {errors[str(r)]}" for r in missing if str(r) in errors)
        return [
            problem(
                f"{_named(missing).capitalize()} did not arrive at the rendezvous"
                f" (127.0.0.1:{result['port']}) within {timeout:g} s{waited}{died}.",
                "A rank that never arrives did not start or cannot reach rank 0: on a busy"
                f" machine give it longer (--timeout {4 * timeout:g}). A run in this state"
                " waits for it until its own timeout.",
            )
        ]
    if errors:
        ranks_of: dict[str, list[int]] = {}
        for rank, error in sorted(errors.items(), key=lambda item: int(item[0])):
            ranks_of.setdefault(error, []).append(int(rank))
        debug = "NCCL_DEBUG=INFO" if nccl else "TORCH_DISTRIBUTED_DEBUG=DETAIL"
        return [
            problem(
                f"{_named(ranks).capitalize()} failed: {error}",
                f"Rerun with {debug} for the backend's own account of it.",
            )
            for error, ranks in ranks_of.items()
        ]
    unfinished = [r for r in result["arrived"] if r not in result["finished"]]
    if unfinished:
        # Lightning-AI/pytorch-lightning#19425: DDP stuck on one machine until P2P was off.
        fix = (
            "On some machines NCCL's peer-to-peer path hangs: rerun as `NCCL_P2P_DISABLE=1"
            f" {command} --distributed`. If that passes, export NCCL_P2P_DISABLE=1 for runs"
            " (slower) until PCIe ACS, the IOMMU or the driver is fixed (NCCL's"
            " troubleshooting guide)."
            if nccl
            else f"On a busy machine give it longer (--timeout {4 * timeout:g}); if gloo"
            " picks an address this machine cannot reach, set GLOO_SOCKET_IFNAME=lo."
        )
        return [
            problem(
                "Every rank arrived, but the all-reduce and broadcast did not finish within"
                f" {timeout:g} s on {_named(unfinished)}: a collective that hangs.",
                fix,
            )
        ]
    if result["wrong"]:
        return [
            problem(
                f"The all-reduce or broadcast gave wrong values on {_named(result['wrong'])}.",
                "The GPUs' link or driver corrupts data: rerun with NCCL_P2P_DISABLE=1 to see"
                " whether peer access is at fault, and run NCCL's own tests (nccl-tests)."
                if nccl
                else "Rerun it; if it repeats, report it with the output of `--json`.",
            )
        ]
    return []


def check(
    torch_facts: dict[str, Any],
    world_size: int | None = None,
    timeout: float = TIMEOUT,
    env: Mapping[str, str] = os.environ,
    command: str = "doctor",
    ranks: Iterable[int] | None = None,
) -> dict[str, Any]:
    """The check's facts and problems; `ok` when every rank finished with the right values.
    `torch_facts` is what the doctor probed (the visible GPUs, NCCL); `ranks` are the ranks
    to start (all; fewer plants ranks that never arrive)."""
    gpus = torch_facts["device_count"]
    backend = "nccl" if gpus and torch_facts["distributed"]["nccl"] else "gloo"
    world = world_size or gpus or 2
    result: dict[str, Any] = {"world_size": world, "backend": backend, "timeout_s": timeout}
    found = nccl_variables(env) + taken_port(env)
    hidden = hidden_devices(world, gpus if backend == "nccl" else 0, env)
    if hidden or not torch_facts["distributed"]["available"]:  # the doctor says why
        return {**result, "launched": False, "ok": False, "problems": found + hidden}
    result |= launch(world, backend, timeout, range(world) if ranks is None else ranks)
    bad = outcome(result, command)
    return {**result, "launched": True, "ok": not bad, "problems": found + bad}


def launch(world: int, backend: str, timeout: float, ranks: Iterable[int]) -> dict[str, Any]:
    """Start `ranks` of a group of `world`; wait at most `timeout` seconds, then kill the rest."""
    import multiprocessing
    from multiprocessing.connection import Connection, wait

    import torch

    # Fork starts a rank in milliseconds; a process with CUDA initialised cannot fork one.
    fork = sys.platform == "linux" and not torch.cuda.is_initialized()
    context = multiprocessing.get_context("fork" if fork else "spawn")
    port, size = free_port(), MESSAGE_MIB[backend] * 2**20
    sys.stdout.flush()  # or a forked rank prints what is still buffered again
    sys.stderr.flush()
    start = time.monotonic()
    processes, readers = {}, {}
    for rank in ranks:
        reader, writer = context.Pipe(duplex=False)
        args = (rank, world, port, backend, timeout, size, writer)
        processes[rank] = context.Process(target=_rank, args=args, daemon=True)
        processes[rank].start()
        writer.close()  # the rank holds the only writer left: the reader sees EOF when it ends
        readers[reader] = rank
    seen: dict[str, dict[int, Any]] = {
        key: {} for key in ("arrived", "joined", "finished", "error")
    }
    while readers and (left := start + timeout - time.monotonic()) > 0:
        for reader in wait(list(readers), timeout=left):
            rank = readers[reader]
            try:
                kind, value = cast(Connection, reader).recv()
            except EOFError:  # the rank ended before it finished
                kind, value = "error", None
            seen[kind][rank] = time.monotonic() - start if kind == "joined" else value
            if kind in ("finished", "error"):  # done: what it does after is not waited for
                del readers[reader]
    for rank, process in processes.items():
        if process.is_alive():
            process.kill()
        process.join()
        if rank in seen["error"] and seen["error"][rank] is None:  # it ended without a word
            seen["error"][rank] = f"its process ended with exit code {process.exitcode}"
    finished = seen["finished"]
    timings = finished.get(0) or next(iter(finished.values()), None)
    seconds = timings["allreduce_s"] if timings else None
    algbw = size / seconds / 1e9 if seconds else None
    return {
        "port": port,
        "message_mib": MESSAGE_MIB[backend],
        "arrived": sorted(seen["arrived"]),
        "missing": sorted(set(range(world)) - set(seen["arrived"])),
        "finished": sorted(finished),
        "formed_s": max(seen["joined"].values()) if len(seen["joined"]) == world else None,
        "allreduce_s": seconds,
        "broadcast_s": timings["broadcast_s"] if timings else None,
        # busbw as nccl-tests define it: what each link carries in a ring all-reduce.
        "busbw_gbps": algbw * 2 * (world - 1) / world
        if algbw and backend == "nccl" and world > 1
        else None,
        "errors": {str(rank): error for rank, error in sorted(seen["error"].items())},
        "wrong": sorted(rank for rank, found in finished.items() if not found["right"]),
    }


def _rank(rank: int, world: int, port: int, backend: str, timeout: float, size: int, pipe) -> None:
    """One rank: join the group, time the all-reduce and the broadcast, check their values."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # forked: the parent's thread pool is not this process's
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)  # its own store, even under torchrun
    gpu = backend == "nccl"
    if gpu:  # one GPU a rank, by its rank
        torch.cuda.set_device(rank)
    device = torch.get_default_device() if not gpu else torch.cuda.current_device()

    def timed(collective: Callable[[], Any]) -> float:
        begin = time.perf_counter()
        collective()
        if gpu:
            torch.cuda.synchronize(device)
        return time.perf_counter() - begin

    pipe.send(("arrived", None))
    try:
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            world_size=world,
            rank=rank,
            timeout=timedelta(seconds=timeout),
            device_id=device if gpu else None,
        )
        values = torch.full((size // 4,), rank + 1.0, device=device)
        dist.all_reduce(values)  # the first: the group forms (and warms up)
        right = bool((values == world * (world + 1) / 2).all())
        pipe.send(("joined", None))
        reduces, broadcasts = [], []
        for _ in range(ITERATIONS):
            reduces.append(timed(lambda: dist.all_reduce(values)))
            values.fill_(rank + 1.0)
            broadcasts.append(timed(lambda: dist.broadcast(values, src=0)))
            right &= bool((values == 1.0).all())  # rank 0's values, everywhere
        medians = {"allreduce_s": statistics.median(reduces)}
        medians["broadcast_s"] = statistics.median(broadcasts)
        pipe.send(("finished", {**medians, "right": right}))
        dist.destroy_process_group()
    except Exception as error:  # for the parent to report, by rank
        lines = str(error).strip().splitlines() or [""]
        pipe.send(("error", f"{type(error).__name__}: {lines[0]}"))


def format_check(result: dict[str, Any]) -> str:
    """The check as the doctor prints it: facts, problems with fixes, one result line."""
    world, backend, timeout = result["world_size"], result["backend"], result["timeout_s"]
    where = "GPUs" if backend == "nccl" else "the CPU"
    lines = [f"Distributed: {world} rank(s), {backend} on {where}, timeout {timeout:g} s"]
    if result["launched"]:
        arrived = ", ".join(map(str, result["arrived"])) or "none"
        missing = f" | did not arrive: {', '.join(map(str, result['missing']))}"
        formed = result["formed_s"]
        lines.append(
            f"  rendezvous 127.0.0.1:{result['port']} | arrived: {arrived}"
            + (missing if result["missing"] else "")
            + (f" | group formed in {formed:.2f} s" if formed is not None else "")
        )
    if result["launched"] and result["allreduce_s"] is not None:
        mib = result["message_mib"]
        lines.append(
            f"  all-reduce of {mib} MiB: {result['allreduce_s'] * 1e3:.2f} ms | broadcast:"
            f" {result['broadcast_s'] * 1e3:.2f} ms (medians of {ITERATIONS})"
        )
        if result["busbw_gbps"] is not None:
            lines.append(
                f"  bus bandwidth: {result['busbw_gbps']:.1f} GB/s (algbw x 2(n-1)/n, as"
                " nccl-tests report it)"
            )
    for found in result["problems"]:
        lines += [f"  - {found['problem']}", f"    Fix: {found['fix']}"]
    if result["ok"]:
        lines.append(
            f"Result: {world} rank(s) formed a {backend} group; the all-reduce and broadcast"
            " gave the right values."
        )
    elif not result["launched"]:
        lines.append("Result: not run; see the problems above.")
    else:
        lines.append("Result: the process group is not usable here; see the problems above.")
    return "\n".join(lines)
