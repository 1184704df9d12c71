"""requirements.lock keeps up with pyproject.toml, offline: every package the project
and its extras ask for is pinned there within its bounds, with hashes; torch and the
CUDA runtime of its builds are not; and its cutoff (`exclude-newer`) is a week old.

CI's `lock` job also resolves the lock again with uv and fails on any difference:
that needs the network, this does not. After a change to the dependencies:
`uv pip compile pyproject.toml -o requirements.lock` (docs/install.md, The lock).
"""

import datetime
import re
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from support import PROJECT_ROOT

if sys.version_info >= (3, 11):  # noqa: UP036 (the same file serves Python 3.10)
    import tomllib
else:  # pytest's own dependency there
    import tomli as tomllib  # ty: ignore[import-not-found] (only where the lock installs it)

LOCK = PROJECT_ROOT / "requirements.lock"
AGAIN = "write it again: uv pip compile pyproject.toml -o requirements.lock"
COOLDOWN = datetime.timedelta(days=7)


def settings() -> dict:
    return tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def pins(text: str) -> list[tuple[str, Version, str, list[str]]]:
    """(name, version, marker, hashes) of each package the lock pins."""
    found = []
    for block in re.split(r"^(?=[^\s#])", text, flags=re.MULTILINE):
        match = re.match(r"([A-Za-z0-9._-]+)==(\S+)(?: ; ([^\\\n]+))?", block)
        if match:
            name, version, marker = match.groups()
            hashes = re.findall(r"--hash=(sha256:[0-9a-f]{64})", block)
            found.append((canonicalize_name(name), Version(version), marker or "", hashes))
    return found


def requirements(meta: dict) -> list[Requirement]:
    """What the project and every extra ask for, but torch (its build is the user's)."""
    lists = [meta["project"]["dependencies"], *meta["project"]["optional-dependencies"].values()]
    wanted = [Requirement(line) for group in lists for line in group]
    return [r for r in wanted if canonicalize_name(r.name) != "torch"]


def test_every_requirement_is_pinned_within_its_bounds_with_hashes():
    assert LOCK.is_file(), f"{LOCK.name} is missing: {AGAIN}"
    locked = pins(LOCK.read_text(encoding="utf-8"))
    assert locked and all(hashes for *_, hashes in locked), f"a pin without hashes: {AGAIN}"
    for requirement in requirements(settings()):
        name = canonicalize_name(requirement.name)
        versions = [version for pin, version, _, _ in locked if pin == name]
        assert versions, f"pyproject.toml asks for {requirement}, which {LOCK.name} lacks: {AGAIN}"
        outside = [str(v) for v in versions if v not in requirement.specifier]
        assert not outside, f"{LOCK.name} pins {name}=={outside[0]}, outside {requirement}: {AGAIN}"


def test_torch_and_its_cuda_runtime_are_left_to_the_build_you_install():
    left_out = {canonicalize_name(n) for n in settings()["tool"]["uv"]["pip"]["no-emit-package"]}
    assert "torch" in left_out
    for name, version, _, _ in pins(LOCK.read_text(encoding="utf-8")):
        cuda = name.startswith(("nvidia-", "cuda-")) or name == "triton"
        assert not cuda, (
            f"{LOCK.name} pins {name}=={version}, which only PyPI's CUDA build of torch needs:"
            " add it to no-emit-package in [tool.uv.pip] of pyproject.toml, then " + AGAIN
        )


def test_the_cutoff_is_at_least_a_week_old():
    """Nothing published in the week before the lock was written: today stands in for
    that day, and only grows older."""
    cutoff = settings()["tool"]["uv"]["exclude-newer"]
    day = datetime.date.fromisoformat(str(cutoff)[:10])
    today = datetime.date.today()
    assert day <= today - COOLDOWN, (
        f"exclude-newer = {cutoff!r} in pyproject.toml is less than 7 days before today"
        f" ({today}): move it to {today - COOLDOWN} or earlier, then " + AGAIN
    )
