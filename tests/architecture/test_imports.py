"""The server's import graph: no cycles (imports under ``if TYPE_CHECKING:`` count too), torch only
in the worker, and the archiver reached from ``serving`` only through ``serving/archives.py``."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2] / "server"
PACKAGE = "torchbay.server"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports anywhere (functions and TYPE_CHECKING blocks included)."""
    tree = ast.parse(path.read_text(), str(path))
    package = _module_name(path)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            # ``from torchbay.server.serving import protocol``: the submodule is what is imported
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    files = {_module_name(f): f for f in ROOT.rglob("*.py")}
    return {name: {m for m in _imports(f) if m in files and m != name} for name, f in files.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as a path that ends where it starts, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _packages_excluded(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """A package's ``__init__`` is imported on the way to any of its modules: leave the edges to
    packages out (they import nothing here), keep module-to-module edges."""
    packages = {n for n in graph if (ROOT / Path(*n.split(".")[2:]) / "__init__.py").is_file()}
    return {n: deps - packages for n, deps in graph.items()}


def test_every_server_module_imports() -> None:
    for name in sorted(_graph()):
        if not name.endswith(".__main__"):  # runs the worker
            importlib.import_module(name)


def test_the_server_has_no_import_cycles() -> None:
    graph = _packages_excluded(_graph())
    assert len(graph) > 30
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_torch_only_in_the_worker_and_archiver_only_through_its_seam(path: Path) -> None:
    imports = _imports(path)
    relative = path.relative_to(ROOT)
    if relative.parts[0] != "worker":
        assert not {m for m in imports if m == "torch" or m.startswith("torch.")}, relative
        assert not {m for m in imports if m.startswith("torchbay.handlers")}, relative
    archiver = {m for m in imports if m.startswith("torchbay.archiver")}
    if archiver:
        assert relative == Path("serving/archives.py"), f"{relative} imports {sorted(archiver)}"


# The server, and the benchmarks and the archiver beside it (the import rules above are the
# server's; the size rule holds for all three).
SIZED = sorted(
    p for part in ("server", "benchmarks", "archiver") for p in (ROOT.parent / part).rglob("*.py")
)


@pytest.mark.parametrize("path", SIZED, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_modules_and_functions_stay_small(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= 400, f"{path.name} has over 400 lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            assert length <= 60, f"{path.name}:{node.lineno} {node.name} has {length} lines"


# Which sub-packages each part of the server may import (its own modules always).
ALLOWED = {
    "errors": set(),
    "config": {"errors"},
    "serving": {"config", "errors"},
    "observe": {"serving", "config", "errors"},
    "plane": {"serving", "observe", "config", "errors"},  # every protocol's operations
    "http": {"plane", "serving", "observe", "config", "errors"},
    "grpc": {"http", "plane", "serving", "observe", "config", "errors"},  # shares http's auth
    "worker": {"serving", "observe", "errors"},  # the protocol, the JSON log formatter
    "admin": {"errors"},
}


def _part(module: str) -> str:
    parts = module.split(".")[2:]
    return parts[0] if parts else "(root)"


def test_the_parts_import_one_way() -> None:
    wrong = [
        f"{source} imports {target}"
        for source, targets in _graph().items()
        if _part(source) in ALLOWED
        for target in targets
        if _part(target) != _part(source) and _part(target) not in ALLOWED[_part(source)]
    ]
    assert not wrong, wrong
