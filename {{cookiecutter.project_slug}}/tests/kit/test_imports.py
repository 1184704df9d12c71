"""The kit's imports run one way: no cycle among its modules, nothing of yours, and
no tool (doctor, bench, export, sweep, ...) in the run core a fit loads.

Read from the source (ast), so a late import inside a function counts too; and, for
the core, from what a real fit loaded.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from support import PACKAGE, SRC, SUBPROCESS_TIMEOUT, cli_env, failure

KIT = SRC / PACKAGE / "kit"


def kit_imports(path: Path, late: bool = True) -> set[str]:
    """The modules `path` imports, by absolute name: `<package>.kit.cli`, `torch`, ...
    (without `late`, only those imported as the module loads)."""
    here = f"{PACKAGE}.kit"
    names = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree) if late else tree.body:
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


# The kit's tools: commands of their own, built on the run core (kit/__init__.py).
TOOLS = {
    "bench",
    "collectives",
    "doctor",
    "export",
    "export_flags",
    "folder",
    "memory",
    "repeat",
    "stopping",
    "sweep",
    "trial",
}
# What only the tools need, never a fit.
TOOL_LIBRARIES = {"optuna", "onnx", "onnxruntime", "onnxscript", "matplotlib", "safetensors"}


def core() -> set[str]:
    """The run core: every kit module cli.py reaches by its imports, late ones included."""
    edges, found, todo = graph(), set(), [f"{PACKAGE}.kit.cli"]
    while todo:
        module = todo.pop()
        if module not in found:
            found.add(module)
            todo += edges[module]
    return {name.rpartition(".")[2] for name in found}


def test_the_run_core_imports_no_tool():
    modules = core()
    assert {"cli", "callbacks", "checkpoints", "resume", "spec"} <= modules
    assert modules & TOOLS == set(), sorted(modules & TOOLS)
    # internals.py holds the private names of every part, the tools' too: those of a tool's
    # library are imported inside the functions the tool calls.
    libraries = {
        f"{name}.py: {module}"
        for name in modules
        for module in kit_imports(KIT / f"{name}.py", late=name != "internals")
        if module.partition(".")[0] in TOOL_LIBRARIES
    }
    assert not libraries, sorted(libraries)
    # Every kit module is one or the other.
    every = {path.stem for path in KIT.glob("*.py")} - {"__init__"}
    assert every == modules | TOOLS, sorted(every - modules - TOOLS)


@pytest.mark.slow
def test_a_fit_loads_no_tool(workdir):
    """A short fit in a process of its own: no tool of the kit, nor Optuna or ONNX."""
    script = (
        "import sys\n"
        f"from {PACKAGE}.__main__ import project\n"
        f"from {PACKAGE}.kit.cli import main\n"
        "main(['fit', '--trainer.fast_dev_run=true'], project())\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=workdir,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )
    assert result.returncode == 0, failure("fit", result)
    loaded = set(result.stdout.split())
    tools = {f"{PACKAGE}.kit.{name}" for name in TOOLS} & loaded
    libraries = {name for name in loaded if name.partition(".")[0] in ("optuna", "onnx")}
    assert not tools and not libraries, sorted(tools | libraries)
