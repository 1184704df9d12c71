"""The rendered project with uv: `uv sync --extra cpu|cu126|cu130` takes torch from
PyTorch's index for that build, and the extras exclude one another.

PyTorch's indexes cannot be reached from the test machines, so the resolution
runs offline, with uv itself, on a copy of the rendered pyproject.toml whose
PyTorch index URLs point to local folders; every package, torch's builds
included, is a metadata-only stand-in wheel made here. What is checked is the
wiring (extras, sources, indexes, conflicts), not PyTorch's servers.
"""

import os
import re
import subprocess
import sys
import tomllib
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from conftest import render
from packaging.requirements import Requirement
from uv import find_uv_bin

# The builds torch 2.13 publishes (its release matrix: CUDA 12.6 and 13.0, and CPU).
BUILDS = ("cpu", "cu126", "cu130")
TORCH = "2.13.0"


def pyproject(project: Path) -> dict:
    return tomllib.loads((project / "pyproject.toml").read_text())


def test_each_torch_build_is_an_extra_with_its_own_explicit_index(tmp_path):
    meta = pyproject(render(tmp_path))
    torch = [d for d in meta["project"]["dependencies"] if Requirement(d).name == "torch"]
    extras = meta["project"]["optional-dependencies"]
    for build in BUILDS:
        assert extras[build] == torch  # the same bounds as the dependency pip installs
    uv = meta["tool"]["uv"]
    assert uv["conflicts"] == [[{"extra": build} for build in BUILDS]]
    assert uv["sources"]["torch"] == [
        {"index": f"pytorch-{build}", "extra": build} for build in BUILDS
    ]
    indexes = {index["name"]: index for index in uv["index"]}
    assert indexes == {
        f"pytorch-{build}": {
            "name": f"pytorch-{build}",
            "url": f"https://download.pytorch.org/whl/{build}",
            "explicit": True,  # only torch comes from it; everything else from PyPI
        }
        for build in BUILDS
    }


def stand_in_wheel(folder: Path, name: str, release: str, extras=()) -> Path:
    """A wheel with metadata and nothing else: enough for uv to resolve and plan."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = re.sub(r"[-.]+", "_", name)
    info = f"{dist}-{release}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {release}\n"
    metadata += "".join(f"Provides-Extra: {extra}\n" for extra in extras)
    files = {
        f"{info}/METADATA": metadata,
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"])
    path = folder / f"{dist}-{release}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for member, text in files.items():
            wheel.writestr(member, text)
    return path


def installed_or_lowest(requirement: Requirement) -> str:
    try:
        return version(requirement.name)
    except PackageNotFoundError:
        return min(str(spec.version) for spec in requirement.specifier if ">" in spec.operator)


def offline_copy(project: Path, root: Path) -> Path:
    """The project's pyproject.toml beside local indexes: PyTorch's as flat folders of
    torch builds, PyPI as a simple index of every other requirement."""
    meta = pyproject(project)
    requirements = [Requirement(r) for r in meta["project"]["dependencies"]]
    for group in meta["project"]["optional-dependencies"].values():
        requirements += [Requirement(r) for r in group]
    simple = root / "simple"
    for requirement in {r.name: r for r in requirements}.values():
        release = TORCH if requirement.name == "torch" else installed_or_lowest(requirement)
        wheel = stand_in_wheel(root / "wheels", requirement.name, release, requirement.extras)
        page = simple / requirement.name
        page.mkdir(parents=True)
        # Published before the cutoff, as PyPI says (PEP 700); PyTorch's folders say nothing.
        uploaded = 'data-upload-time="2026-01-01T00:00:00Z"'
        (page / "index.html").write_text(
            f'<a href="{wheel.as_uri()}" {uploaded}>{wheel.name}</a>\n'
        )
    text = (project / "pyproject.toml").read_text()
    for build in BUILDS:
        # PyTorch's index as a simple index whose files give no upload date: the
        # cutoff exempts torch (exclude-newer-package), or uv would find no torch.
        wheel = stand_in_wheel(root / build / "files", "torch", f"{TORCH}+{build}")
        (root / build / "torch").mkdir()
        link = f'<a href="{wheel.as_uri()}">{wheel.name}</a>\n'
        (root / build / "torch" / "index.html").write_text(link)
        url = f'url = "https://download.pytorch.org/whl/{build}"'
        assert url in text
        text = text.replace(url, f'url = "{(root / build).as_uri()}"')
    copy = root / "project"
    copy.mkdir()
    (copy / "pyproject.toml").write_text(text)
    (copy / "README.md").write_text((project / "README.md").read_text())
    return copy


def uv(*args: str, cwd: Path, root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [find_uv_bin(), *args, "--offline", "--default-index", (root / "simple").as_uri()],
        cwd=cwd,
        env={
            "PATH": "/usr/bin:/bin",
            "UV_CACHE_DIR": str(root / "cache"),
            "UV_PYTHON": sys.executable,
            "UV_NO_PROGRESS": "1",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("answers", [{}, {"example": "minimal", "cluster": False}])
def test_uv_resolves_each_build_from_its_own_index_and_never_two(tmp_path, answers):
    project = offline_copy(render(tmp_path / "render", **answers), tmp_path)
    locked = uv("lock", cwd=project, root=tmp_path)
    assert locked.returncode == 0, locked.stderr
    lock = tomllib.loads((project / "uv.lock").read_text())
    torches = {
        p["version"]: p["source"]["registry"] for p in lock["package"] if p["name"] == "torch"
    }
    assert torches == {
        TORCH: (tmp_path / "simple").as_posix(),  # no extra: PyPI's, as pip would install
        **{f"{TORCH}+{build}": (tmp_path / build).as_posix() for build in BUILDS},
    }
    for build in BUILDS:
        plan = uv("sync", "--extra", build, "--dry-run", cwd=project, root=tmp_path)
        assert plan.returncode == 0, plan.stderr
        wanted = re.findall(r"^ \+ torch==(\S+)$", plan.stderr, re.MULTILINE)
        assert wanted == [f"{TORCH}+{build}"], plan.stderr
    both = uv("sync", "--extra", "cpu", "--extra", "cu130", "--dry-run", cwd=project, root=tmp_path)
    assert both.returncode != 0
    assert "incompatible with the declared conflicts" in both.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "answers", [{}, {"example": "minimal", "logger": "wandb", "cluster": False}]
)
def test_the_lock_is_what_uv_resolves_from_pyproject_under_its_cutoff(tmp_path, answers):
    """The rendered requirements.lock, byte for byte, is what the one command its pyproject
    names writes there from PyPI today: the cutoff (`exclude-newer`) keeps anything
    published after it out, so the same file comes back however much has been released
    since (scripts/lock.py writes the template's, for every combination of options)."""
    project = render(tmp_path / "render", **answers)
    copy = tmp_path / "again"
    copy.mkdir()
    for name in ("pyproject.toml", "README.md"):
        (copy / name).write_text((project / name).read_text())
    cutoff = pyproject(project)["tool"]["uv"]["exclude-newer"]
    assert cutoff.endswith("T00:00:00Z")
    written = subprocess.run(
        [find_uv_bin(), "pip", "compile", "pyproject.toml", "-q", "-o", "requirements.lock"],
        cwd=copy,
        # This machine's certificates and proxies as they are; uv's own settings none.
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("UV_")},
            "UV_CACHE_DIR": str(tmp_path / "cache"),
            "UV_PYTHON": sys.executable,
            "XDG_CONFIG_HOME": str(tmp_path),
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert written.returncode == 0, written.stderr
    assert (copy / "requirements.lock").read_text() == (project / "requirements.lock").read_text()


def test_the_merged_lock_renders_each_combinations_own_lock_back():
    """scripts/lock.py keeps one template for the 16 locks: a package's lines that some
    renders lack (or pin otherwise) are behind a condition on the options."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
    import lock

    head = "# This file was autogenerated by uv via the following command:\n#    uv pip compile\n"
    foot = "\n# The following packages were excluded from the output:\n# torch\n"
    pin = "{}=={} \\\n    --hash=sha256:{}\n    # via {}\n"
    shared = pin.format("aaa", "1.0", "a" * 64, "lightning")
    locks = {}
    for example, logger, cluster in (
        (e, g, c) for e in ("digits", "minimal") for g in ("csv", "wandb") for c in (True, False)
    ):
        body = shared
        if logger == "wandb":  # a package only one logger brings, in two versions by example
            body += pin.format("bbb", "2.0" if example == "digits" else "2.1", "b" * 64, "wandb")
        if cluster:
            body += pin.format(
                "ccc", "3.0", "c" * 64, "{{ cookiecutter.project_slug }} (pyproject.toml)"
            )
        locks[lock.key({"example": example, "logger": logger, "cluster": cluster})] = (
            head + body + foot
        )
    template = lock.merge(locks)  # raises unless each renders back, byte for byte
    assert template.count("{% if lock in") == 3 and shared in template
