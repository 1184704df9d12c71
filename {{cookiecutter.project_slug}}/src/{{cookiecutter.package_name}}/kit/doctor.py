"""`<command> doctor`: what is wrong with this machine for training, and the fix.

It checks the chain: NVIDIA driver -> CUDA runtime -> the
CUDA version torch was built with -> the devices torch can see. It imports
torch but never Lightning, so it still answers when Lightning's install is
broken, and it answers fast.

    <command> doctor                # the report; exit 0 unless torch is missing
    <command> doctor --require_gpu  # exit 1 unless a GPU is usable (CI, job scripts)
    <command> doctor --json         # the same facts as one JSON object
    <command> doctor --memory       # and will the project's model fit, per rank, under DDP
                                    # or FSDP (--world_size N, --devices_free_gib X; kit/memory.py)
    <command> doctor --ckpt_path PATH    # on which numbers of processes and batches a checkpoint
                                    # resumes with its global batch (kit/resume.py)
    <command> doctor --distributed  # and can N local ranks form a process group: an
                                    # all-reduce and a broadcast, timed, under --timeout
                                    # (--world_size N; kit/collectives.py)

`--memory` needs the project, so it imports Lightning and your code; the plain
doctor never does.
"""

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any

from . import KIT_VERSION
from .internals import unchecked_releases
from .machine import build_name, cuda_devices

if TYPE_CHECKING:
    from .memory import Built
    from .spec import Project


@dataclass(frozen=True)
class Finding:
    problem: str
    fix: str


def _version_tuple(text: str | None) -> tuple[int, ...] | None:
    match = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def probe_nvidia_smi(timeout: float = 10.0) -> dict[str, Any] | None:
    """Driver version, the newest CUDA it supports, and its GPUs; None without nvidia-smi."""
    path = shutil.which("nvidia-smi")
    if path is None:
        return None
    facts: dict[str, Any] = {"path": path, "driver_version": None, "cuda_version": None}
    try:
        header = subprocess.run([path], capture_output=True, text=True, timeout=timeout).stdout
        listing = subprocess.run(
            [path, "-L"], capture_output=True, text=True, timeout=timeout
        ).stdout
    except (OSError, subprocess.SubprocessError) as err:
        facts["error"] = str(err)
        header = listing = ""
    if match := re.search(r"Driver Version:\s*([\d.]+)", header):
        facts["driver_version"] = match.group(1)
    if match := re.search(r"CUDA Version:\s*([\d.]+)", header):
        facts["cuda_version"] = match.group(1)
    facts["gpus"] = re.findall(r"^GPU \d+: (.+?)(?: \(UUID.*)?$", listing, re.MULTILINE)
    return facts


def probe_torch() -> dict[str, Any]:
    """What torch was built with and what it can see."""
    try:
        import torch
    except Exception as err:  # a broken install raises more than ImportError
        return {"importable": False, "error": f"{type(err).__name__}: {err}"}
    facts: dict[str, Any] = {
        "importable": True,
        "version": torch.__version__,
        "cuda_build": torch.version.cuda,
        "hip_build": getattr(torch.version, "hip", None),
        "cudnn_available": bool(torch.backends.cudnn.is_available()),
        "cudnn_version": None,
        "cuda_available": bool(torch.cuda.is_available()),
        "device_count": 0,
        "devices": [],
    }
    if facts["cudnn_available"]:
        facts["cudnn_version"] = torch.backends.cudnn.version()
    if facts["cuda_build"] and not facts["cuda_available"]:
        facts["cuda_libraries_bytes"] = cuda_library_bytes()
    if facts["cuda_available"]:
        facts["devices"] = cuda_devices()
        facts["device_count"] = len(facts["devices"])
    dist = getattr(torch, "distributed", None)
    available = bool(dist is not None and dist.is_available())
    facts["distributed"] = {
        "available": available,
        "nccl": bool(available and dist.is_nccl_available()),
        "gloo": bool(available and dist.is_gloo_available()),
    }
    return facts


def cuda_library_bytes() -> int:
    """The disk that the CUDA libraries installed beside torch take (the nvidia-*, cuda-*
    and triton packages of PyPI's Linux build), read from their metadata."""
    total = 0
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith(("nvidia-", "cuda-")) or name == "triton":
            total += sum(file.size or 0 for file in dist.files or ())
    return total


def package_versions(names: tuple[str, ...] = ("lightning", "torchmetrics")) -> dict:
    """Installed versions, read from metadata: nothing is imported."""
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def collect() -> dict[str, Any]:
    from .collectives import environment

    return {
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "torch": probe_torch(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "environment": environment(os.environ),  # the rendezvous, launcher and NCCL variables
        "nvidia_smi": probe_nvidia_smi(),
        "packages": package_versions(),
        "unchecked": unchecked_releases(),  # not a fault: the internals tests tell
    }


def usable_gpu(facts: dict[str, Any]) -> bool:
    torch_facts = facts["torch"]
    return bool(torch_facts.get("cuda_available") and torch_facts.get("device_count", 0) > 0)


def _visible_device_findings(value: str, smi: dict | None) -> list[Finding]:
    entries = [e.strip() for e in value.split(",") if e.strip()]
    gpu_count = len(smi["gpus"]) if smi else None
    if not entries or entries[0].startswith("-"):
        where = f" (nvidia-smi lists {gpu_count})" if gpu_count else ""
        return [
            Finding(
                f"CUDA_VISIBLE_DEVICES={value!r} hides every GPU{where}.",
                "Unset it (`unset CUDA_VISIBLE_DEVICES`) or list the GPUs to use, e.g. "
                "CUDA_VISIBLE_DEVICES=0,1.",
            )
        ]
    if gpu_count is None:
        return []
    missing = [e for e in entries if e.isdigit() and int(e) >= gpu_count]
    if not missing:
        return []
    return [
        Finding(
            f"CUDA_VISIBLE_DEVICES={value!r} names GPU {', '.join(missing)}, but this machine "
            f"has {gpu_count} (0-{gpu_count - 1}); CUDA ignores every entry from the first "
            "missing one on.",
            f"Name only GPUs 0-{gpu_count - 1}, or unset CUDA_VISIBLE_DEVICES.",
        )
    ]


def diagnose(facts: dict[str, Any]) -> list[Finding]:
    """Every problem found, each with its fix in one sentence."""
    t, smi = facts["torch"], facts["nvidia_smi"]
    if not t.get("importable"):
        return [
            Finding(
                f"torch cannot be imported ({t.get('error')}).",
                "Install torch first, with the command for your platform from pytorch.org.",
            )
        ]
    findings: list[Finding] = []
    cuda_build = t["cuda_build"]
    if not cuda_build and not t["hip_build"] and smi:
        findings.append(
            Finding(
                f"torch {t['version']} is a CPU-only build, but this machine has an NVIDIA "
                f"driver ({smi['driver_version'] or 'version unknown'}): training would "
                "silently run on the CPU.",
                "Reinstall torch with the CUDA build from pytorch.org, for a CUDA version no "
                f"newer than {smi['cuda_version'] or 'the one nvidia-smi shows'}.",
            )
        )
    if cuda_build and not t["cuda_available"] and smi is None:
        wasted = t.get("cuda_libraries_bytes") or 0
        size = f", and its CUDA libraries take {wasted / 1e9:.1f} GB of disk" if wasted else ""
        release = t["version"].split("+")[0]
        findings.append(
            Finding(
                f"torch {t['version']} is a CUDA {cuda_build} build, but this machine has no "
                f"NVIDIA driver (no nvidia-smi): it trains on the CPU{size}.",
                "Without an NVIDIA GPU, install the CPU build in a new environment (docs/"
                f"install.md): pip install torch=={release} --index-url "
                "https://download.pytorch.org/whl/cpu; with one, install its driver (on a"
                " cluster's login node, keep the build its GPU nodes run).",
            )
        )
    built, supported = _version_tuple(cuda_build), _version_tuple(smi and smi["cuda_version"])
    if built and supported and built > supported:
        findings.append(
            Finding(
                f"The NVIDIA driver {smi['driver_version']} supports CUDA up to "
                f"{smi['cuda_version']}, but torch {t['version']} was built with CUDA "
                f"{cuda_build}: the driver is too old.",
                f"Upgrade the driver, or install a torch built for CUDA {smi['cuda_version']} "
                "or older.",
            )
        )
    visible = facts["cuda_visible_devices"]
    if visible is not None:
        findings += _visible_device_findings(visible, smi)
    from .collectives import stray_variables

    findings += [Finding(**found) for found in stray_variables(facts.get("environment", {}))]
    if cuda_build and t["cuda_available"] and not t["cudnn_available"]:
        findings.append(
            Finding(
                "cuDNN is not available to this CUDA build of torch.",
                "Reinstall torch in a clean environment from pytorch.org; do not mix conda "
                "and pip CUDA packages.",
            )
        )
    if not t["distributed"]["available"]:
        findings.append(
            Finding(
                "torch.distributed is missing from this torch build: DDP cannot run.",
                "Reinstall torch; a standard build always includes it.",
            )
        )
    if cuda_build and smi and not t["cuda_available"] and not findings:
        findings.append(
            Finding(
                "torch is a CUDA build and a driver is present, yet torch.cuda.is_available() "
                "is False.",
                "Run `python -c 'import torch; torch.cuda.init()'` to see CUDA's own error; "
                "after a driver upgrade, a reboot usually fixes it.",
            )
        )
    return findings


def format_report(facts: dict[str, Any], findings: list[Finding]) -> str:
    t, smi = facts["torch"], facts["nvidia_smi"]
    lines = [f"Python {facts['python']} ({facts['platform']})"]
    if t.get("importable"):
        build = build_name(t["cuda_build"], t["hip_build"])
        cudnn = "not available"
        if t["cudnn_available"]:
            cudnn = f"available, version {t['cudnn_version']}"
        lines += [
            f"torch {t['version']} ({build} build)",
            f"cuDNN: {cudnn}",
            f"CUDA available: {t['cuda_available']} | devices: {t['device_count']}",
        ]
        yes_no = {True: "yes", False: "no"}
        lines += [
            f"  GPU {d['index']}: {d['name']} | compute capability {d['capability']} | "
            f"{d['free_gib']} GiB free of {d['total_gib']} GiB | bf16: {yes_no[d['bf16']]}"
            for d in t["devices"]
        ]
        dist = t["distributed"]
        lines.append(
            f"torch.distributed: {yes_no[dist['available']]} | NCCL: {yes_no[dist['nccl']]}"
            f" | gloo: {yes_no[dist['gloo']]}"
        )
    else:
        lines.append(f"torch: cannot be imported ({t['error']})")
    visible = facts["cuda_visible_devices"]
    lines.append(f"CUDA_VISIBLE_DEVICES: {'(unset)' if visible is None else repr(visible)}")
    if smi:
        lines.append(
            f"nvidia-smi: {smi['path']} | driver {smi['driver_version']} | supports CUDA up to "
            f"{smi['cuda_version']} | {len(smi['gpus'])} GPU(s)"
        )
    else:
        lines.append("nvidia-smi: not on the PATH")
    versions = facts["packages"].items()
    packages = " | ".join(f"{name} {version or 'not installed'}" for name, version in versions)
    lines.append(f"{packages} | the kit {KIT_VERSION} (the template's release)")
    if facts.get("unchecked"):
        newer = ", ".join(f"{name} {text}" for name, text in facts["unchecked"].items())
        lines.append(
            f"Not yet checked by the kit: {newer}; `pytest tests/kit/test_internals.py`"
            " says whether the private names it uses still work there."
        )
    lines.append("")
    if findings:
        lines.append("Problems:")
        for finding in findings:
            lines += [f"  - {finding.problem}", f"    Fix: {finding.fix}"]
    else:
        lines.append("No problems found.")
    if usable_gpu(facts):
        count = facts["torch"]["device_count"]
        lines.append(f"Result: {count} usable GPU(s); training will use CUDA.")
    elif t.get("importable") and smi is None:
        # Not a problem: a laptop or a CI runner. (A GPU machine without its driver
        # shows no nvidia-smi either; install the driver there and this line changes.)
        lines.append("Result: no GPU on this machine: training runs on the CPU.")
    elif t.get("importable"):
        lines.append(
            "Result: no usable GPU, so training would run on the CPU; see the problems above."
        )
    return "\n".join(lines)


def parser(command: str = "doctor") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=command,
        description="Check torch, CUDA, the driver and the GPUs, and say what to fix.",
        epilog="With --memory, flags after `--` go to fit's parser, e.g. `-- --config"
        " configs/gpu.yaml --data.batch_size 256`.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "--require_gpu", "--require-gpu", action="store_true", help="exit 1 unless a GPU is usable"
    )
    parser.add_argument("--json", action="store_true", help="print the facts as one JSON object")
    group = parser.add_argument_group("memory (imports Lightning and the project)")
    group.add_argument(
        "--memory",
        action="store_true",
        help="estimate the memory per rank of the project's model under DDP and FSDP and say"
        " which fits; exit 1 when neither does",
    )
    group.add_argument(
        "--world_size",
        "--world-size",
        type=int,
        help="ranks to plan for (default: the visible GPUs, else 1); with --distributed, to"
        " start (default: the visible GPUs, else 2)",
    )
    group.add_argument(
        "--devices_free_gib",
        "--devices-free-gib",
        type=float,
        metavar="GIB",
        help="plan for GPUs with this much free memory each, not this machine's",
    )
    group.add_argument("--precision", help="the run's precision (default: what fit would use here)")
    group = parser.add_argument_group("distributed (starts local processes)")
    group.add_argument(
        "--distributed",
        action="store_true",
        help="form a process group of --world_size local ranks (NCCL on GPUs, gloo on the"
        " CPU), time an all-reduce and a broadcast; exit 1 unless every rank finishes",
    )
    group.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="end the check and name the ranks that did not arrive or finish after this long"
        " (default: 30)",
    )
    parser.add_argument(
        "--ckpt_path",
        "--ckpt-path",
        "--ckpt",
        metavar="PATH",
        help="say on which numbers of processes and batches this checkpoint resumes (imports"
        " Lightning)",
    )
    return parser


# The flags that only mean something with another, and which.
ONLY_WITH = {
    "world_size": ("memory", "distributed"),
    "devices_free_gib": ("memory",),
    "precision": ("memory",),
    "timeout": ("distributed",),
}


def main(
    argv: list[str] | None = None,
    command: str = "doctor",
    project: "Project | Callable[[], Project] | None" = None,
) -> int:
    """`command` is how the report's usage names itself (the console command's `doctor`).
    `project` (or a function returning it, called only for `--memory`) is what
    `--memory` estimates."""
    words = list(sys.argv[1:] if argv is None else argv)
    flags: list[str] = []
    if "--" in words:
        at = words.index("--")
        words, flags = words[:at], words[at + 1 :]
    args = parser(command).parse_args(words)
    if flags and not args.memory:
        print("error: flags after `--`: only with --memory", file=sys.stderr)
        return 2
    for name, needs in ONLY_WITH.items():
        if getattr(args, name) is not None and not any(getattr(args, n) for n in needs):
            named = " or ".join(f"--{n}" for n in needs)
            print(f"error: --{name}: only with {named}", file=sys.stderr)
            return 2
    for name in ("world_size", "timeout") if args.distributed else ():
        if (value := getattr(args, name)) is not None and value <= 0:
            print(f"error: --{name} {value:g}: must be above 0", file=sys.stderr)
            return 2
    if args.ckpt_path is not None:
        return checkpoint_report(args.ckpt_path)
    facts = collect()
    findings = diagnose(facts)
    ok = usable_gpu(facts) if args.require_gpu else facts["torch"].get("importable", False)
    memory = None
    if args.memory:
        memory = memory_plan(args, project, flags)
        if isinstance(memory, str):
            print(memory, file=sys.stderr)
            return 2
    distributed = None
    if args.distributed and facts["torch"].get("importable"):
        from .collectives import TIMEOUT, check

        timeout = args.timeout or TIMEOUT
        distributed = check(facts["torch"], args.world_size, timeout, command=command)
    if args.json:
        report = {**facts, "problems": [asdict(f) for f in findings], "ok": ok}
        if memory is not None:
            from .memory import plan_json

            report["memory"] = plan_json(memory)
        if distributed is not None:
            report["distributed"] = distributed
        print(json.dumps(report, indent=2))
    else:
        print(format_report(facts, findings))
        if memory is not None:
            from .memory import format_plan

            print(f"\n{format_plan(memory)}")
        if distributed is not None:
            from .collectives import format_check

            print(f"\n{format_check(distributed)}")
        if args.require_gpu and not ok:
            print("doctor --require_gpu: no usable GPU (see the problems above).", file=sys.stderr)
    if memory is not None and memory.kind == "neither":
        return 1
    if distributed is not None and not distributed["ok"]:
        return 1
    return 0 if ok else 1


def checkpoint_report(path: str, widest: int = 64) -> int:
    """Print where a checkpoint was saved (processes, batch, accumulation) and, for each
    number of processes up to `widest` that can keep its global batch, the batch and
    accumulation that do; exit 2 for a file that is not a usable checkpoint."""
    from pathlib import Path

    import torch

    from .checkpoints import CheckpointError, check_checkpoint
    from .internals import DCP_METADATA
    from .resume import batch_choices, processes, same_samples, saved_state

    try:
        found = check_checkpoint(path)
    except CheckpointError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    file = found / DCP_METADATA if Path(found).is_dir() else found
    checkpoint = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    saved = saved_state(checkpoint, "ResumeState") or {}
    print(f"{path}: epoch {checkpoint.get('epoch')}, step {checkpoint.get('global_step')}")
    if not saved.get("batch_size"):
        print("  it names no global batch (not a fit's, or an older kit's): resume it as saved")
        return 0
    world, size, accumulate = saved["world_size"], saved["batch_size"], saved["accumulate"]
    total = world * size * accumulate
    print(
        f"  saved by {processes(world)} on {saved.get('accelerator')}, precision"
        f" {saved.get('precision')}: global batch {total} = {size} per device x {world} x"
        f" {accumulate} accumulated"
    )
    # Where it continues the uninterrupted run: as saved, where it kept the loaders'
    # positions; on other numbers, where every step's samples are the same on any.
    kept = all(saved.get("loaders") or [None])
    other = same_samples(saved)
    print("  resumes with that global batch on (processes: per-device batch x accumulation):")
    for count in range(1, min(total, widest) + 1):
        choices = batch_choices(total, count)
        if not choices:
            continue
        # The saved per-device batch where it works, else the largest below it.
        fitting = [c for c in choices if c[0] <= size] or choices[-1:]
        mine = f"{fitting[0][0]} x {fitting[0][1]}"
        note = " (as saved: the same run)" if count == world and kept else ""
        print(f"    {count}: {mine}{note}")
    if other is None:
        print("  on another number, each step trains the same samples (float precision)")
    else:
        print(f"  on another number, the steps train other samples than it would have: {other}")
    print(
        "  other numbers of processes: with --resume_state.keep_global_batch false (the"
        " global batch changes)"
    )
    return 0


def memory_plan(args: argparse.Namespace, project: Any, flags: list[str]) -> Any:
    """The plan of `--memory` (kit/memory.py), or the one-line error to print."""
    if project is None:
        return "error: --memory needs the project: run it as `<command> doctor --memory`"
    from .memory import check_world_size, estimate

    try:
        if args.world_size is not None:
            check_world_size(args.world_size)  # before project.py is imported
    except ValueError as error:
        return f"error: {error}"
    try:
        described = project() if callable(project) else project
    except ValueError as error:
        return f"error: project.py: {error}"
    try:
        return estimate(
            lambda: build_for_memory(described, flags),
            args.world_size,
            args.devices_free_gib,
            args.precision,
        )
    except ValueError as error:  # a value it refused; the message names it
        return f"error: {error}"


def build_for_memory(project: "Project", flags: list[str]) -> "Built":
    """The project's model on the meta device and its DataModule, configured as `fit`
    would (configs/default.yaml, then `flags`); the classes' defaults where the CLI
    cannot build them on the meta device and no flags were given."""
    from .bench import quiet_fits
    from .cli import main
    from .hardware import cuda_capabilities, resolve_precision
    from .memory import META, Built, MemoryPlanError, configure_model, short

    args = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", *flags]
    try:
        with quiet_fits(), META:
            cli = main(args, project, run=False)
            configure_model(cli.model)
        return Built(cli.model, cli.datamodule, str(cli.trainer.precision))
    except (Exception, SystemExit) as error:  # SystemExit: the parser printed why
        if flags:
            detail = "" if isinstance(error, SystemExit) else f": {short(error)}"
            raise MemoryPlanError(
                f"fit refused the flags after `--` ({' '.join(flags)}){detail}"
            ) from error
        why = short(error) if isinstance(error, Exception) else "its parser refused the config"
    with META:
        model = project.model()
        configure_model(model)
    cuda, bf16 = cuda_capabilities()
    precision = resolve_precision("cuda" if cuda else "cpu", bf16)
    note = f"the model's defaults: the CLI could not build it on the meta device ({why})"
    return Built(model, project.datamodule(), precision, [note])


if __name__ == "__main__":
    sys.exit(main())
