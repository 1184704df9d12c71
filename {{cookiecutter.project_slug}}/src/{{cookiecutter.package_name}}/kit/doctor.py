"""`<command> doctor`: what is wrong with this machine for training, and the fix.

It checks the chain the guide describes: NVIDIA driver -> CUDA runtime -> the
CUDA version torch was built with -> the devices torch can see. It imports
torch but never Lightning, so it still answers when Lightning's install is
broken, and it answers fast.

    <command> doctor                # the report; exit 0 unless torch is missing
    <command> doctor --require-gpu  # exit 1 unless a GPU is usable (CI, job scripts)
    <command> doctor --json         # the same facts as one JSON object
"""

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Any

from .machine import build_name, cuda_devices


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
    return {
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "torch": probe_torch(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "nvidia_smi": probe_nvidia_smi(),
        "packages": package_versions(),
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
    lines.append(" | ".join(f"{name} {version or 'not installed'}" for name, version in versions))
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


def main(argv: list[str] | None = None, command: str = "doctor") -> int:
    """`command` is how the report's usage names itself (the console command's `doctor`)."""
    parser = argparse.ArgumentParser(
        prog=command,
        description="Check torch, CUDA, the driver and the GPUs, and say what to fix.",
    )
    parser.add_argument("--require-gpu", action="store_true", help="exit 1 unless a GPU is usable")
    parser.add_argument("--json", action="store_true", help="print the facts as one JSON object")
    args = parser.parse_args(argv)
    facts = collect()
    findings = diagnose(facts)
    ok = usable_gpu(facts) if args.require_gpu else facts["torch"].get("importable", False)
    if args.json:
        print(json.dumps({**facts, "problems": [asdict(f) for f in findings], "ok": ok}, indent=2))
    else:
        print(format_report(facts, findings))
        if args.require_gpu and not ok:
            print("doctor --require-gpu: no usable GPU (see the problems above).", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
