"""The kit's imports run one way: no cycle among its modules, and nothing of yours.

Read from the source (ast), so a late import inside a function counts too.
"""

import ast
from pathlib import Path

from support import PACKAGE, SRC

KIT = SRC / PACKAGE / "kit"


def kit_imports(path: Path) -> set[str]:
    """The modules `path` imports, by absolute name: `<package>.kit.cli`, `torch`, ..."""
    here = f"{PACKAGE}.kit"
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:  # relative: from the kit (level 1) or above it
                parts = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            names.add(base)
            if node.level and not node.module:  # `from . import x`: x is a module
                names |= {f"{base}.{alias.name}" for alias in node.names}
    return names


def graph() -> dict[str, set[str]]:
    """Kit module -> the kit modules it imports."""
    modules = {f"{PACKAGE}.kit.{p.stem}": p for p in KIT.glob("*.py") if p.stem != "__init__"}
    return {name: kit_imports(path) & modules.keys() for name, path in modules.items()}


def cycle_in(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_kit_has_no_import_cycle():
    edges = graph()
    assert len(edges) > 10
    assert cycle_in(edges) is None, " -> ".join(cycle_in(edges) or [])


def test_the_cycle_finder_finds_one():
    assert cycle_in(dict(a={"b"}, b={"c"}, c={"a"})) == ["a", "b", "c", "a"]
    assert cycle_in(dict(a={"b"}, b=set())) is None


def test_the_kit_imports_nothing_of_the_project():
    """The project is passed in (kit/spec.py): no kit module imports the user's files."""
    users = {p.stem for p in (SRC / PACKAGE).glob("*.py")} - {"__init__"}
    mine = {f"{PACKAGE}.{name}" for name in users}
    found = {
        path.name: sorted(kit_imports(path) & mine)
        for path in KIT.glob("*.py")
        if kit_imports(path) & mine
    }
    assert found == {}
    assert {"project", "model", "data", "__main__"} <= users


def test_the_kit_names_no_package():
    """Relative imports inside the kit, the command from the project: the kit never
    names this project's package, so it is the same text in every project."""
    named = [path.name for path in KIT.glob("*.py") if PACKAGE in path.read_text("utf-8")]
    assert named == []
