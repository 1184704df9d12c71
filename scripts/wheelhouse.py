"""Build a folder of wheels that installs the GPU check on a machine without internet.

    python scripts/wheelhouse.py build/wheelhouse --python-version 3.12 --have torch==2.11.0

It holds cookiecutter (to render the template) and every dependency of the
rendered project and its `dev` extra, for the given Python and platform, all
resolved together by pip, but not the packages named with `--have`: those
the node already has (torch always: the node's own CUDA build is the one to
keep). `scripts/gpu_check.sh` installs from it with `WHEELHOUSE=<folder>`.

pip has no way to leave a requirement out of a download. Each package named
with `--have` is stood in for, during the download only, by an empty wheel of
that version (with a local label no index has), so the resolver takes it as
given and fetches none of it; the stand-ins are deleted at the end.
"""

import argparse
import base64
import hashlib
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

from cookiecutter.main import cookiecutter

TEMPLATE = Path(__file__).resolve().parents[1]
LABEL = "wheelhouse"  # the local version label of a stand-in: `2.11.0+wheelhouse`
TOOLS = ["cookiecutter>=2.7,<2.8", "setuptools>=77", "wheel"]


def platforms(machine: str) -> list[str]:
    """The manylinux tags a Linux `machine` takes, older glibc first (pip matches exactly)."""
    tags = [f"manylinux_2_{minor}_{machine}" for minor in range(17, 40)]
    return ["manylinux2014_" + machine, *tags]


def stand_in(folder: Path, name: str, version: str) -> Path:
    """An empty wheel of `name` at `version+wheelhouse`, with no dependencies."""
    dist = name.replace("-", "_")
    full = f"{version}+{LABEL}"
    info = f"{dist}-{full}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {full}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: wheelhouse\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    path = folder / f"{dist}-{full}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for member, text in files.items():
            data = text.encode()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{member},sha256={digest.decode()},{len(data)}")
            wheel.writestr(member, data)
        wheel.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return path


def project_requirements(project: Path) -> list[str]:
    """The rendered project's dependencies and its `dev` extra's."""
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    return [*meta["dependencies"], *meta["optional-dependencies"]["dev"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path, help="the folder of wheels (made if missing)")
    parser.add_argument("--python-version", default="3.12", help="the node's Python (3.12)")
    parser.add_argument("--machine", default="x86_64", help="the node's: x86_64 or aarch64")
    parser.add_argument(
        "--have",
        action="append",
        default=[],
        metavar="NAME==VERSION",
        help="a package the node has, left out (repeatable); torch is always left out",
    )
    parser.add_argument("--torch", default="2.11.0", help="the node's torch version (2.11.0)")
    args = parser.parse_args(argv)
    have = dict(item.split("==", 1) for item in args.have)
    have.setdefault("torch", args.torch)
    args.output.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="wheelhouse-") as work:
        return download(args, have, Path(work))


def download(args: argparse.Namespace, have: dict[str, str], work: Path) -> int:
    """The wheels into args.output, with `work` as scratch for the render and stand-ins."""
    project = Path(cookiecutter(str(TEMPLATE), no_input=True, output_dir=str(work / "render")))
    stand_ins = work / "stand-ins"
    stand_ins.mkdir()
    made = [stand_in(stand_ins, name, version) for name, version in have.items()]
    constraints = work / "constraints.txt"
    constraints.write_text("".join(f"{n}=={v}+{LABEL}\n" for n, v in have.items()))
    abi = "cp" + args.python_version.replace(".", "")
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--only-binary=:all:",
        "--python-version",
        args.python_version,
        "--implementation",
        "cp",
        "--abi",
        abi,
        "--abi",
        "abi3",
        "--abi",
        "none",
        *[word for tag in platforms(args.machine) for word in ("--platform", tag)],
        "--find-links",
        str(stand_ins),
        "--constraint",
        str(constraints),
        "--dest",
        str(args.output),
        *TOOLS,
        *project_requirements(project),
    ]
    subprocess.run(command, check=True)
    for path in made:
        (args.output / path.name).unlink(missing_ok=True)
    wheels = sorted(args.output.glob("*.whl"))
    size = sum(wheel.stat().st_size for wheel in wheels) / 1024**2
    print(
        f"{len(wheels)} wheels, {size:.0f} MiB, in {args.output} (for Python"
        f" {args.python_version} on {args.machine}; left out: {', '.join(sorted(have))})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
