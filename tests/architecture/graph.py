"""The import graph of one of torchbay's folders (server/, handlers/, archiver/), read from the
source with ``ast``: what the architecture tests check their rules against."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).parents[2]


def module_name(path: Path) -> str:
    """``server/http/app.py`` -> ``torchbay.server.http.app`` (folder: ``torchbay.<folder>``)."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["torchbay", *parts])


def _resolve(node: ast.Import | ast.ImportFrom, package: str) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    base = node.module or ""
    if node.level:
        anchor = package.split(".")
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    # ``from torchbay.server.serving import protocol``: the submodule is what is imported
    return {base, *(f"{base}.{alias.name}" for alias in node.names)}


def _package(path: Path) -> str:
    name = module_name(path)
    return name if path.name == "__init__.py" else name.rsplit(".", 1)[0]


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports anywhere (functions and TYPE_CHECKING blocks included)."""
    tree = ast.parse(path.read_text(), str(path))
    package = _package(path)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            found |= _resolve(node, package)
    return found


def _import_time_nodes(statements: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []
    for statement in statements:
        if isinstance(statement, ast.Import | ast.ImportFrom):
            found.append(statement)
        elif isinstance(statement, ast.If) and "TYPE_CHECKING" not in ast.unparse(statement.test):
            found += _import_time_nodes(statement.body) + _import_time_nodes(statement.orelse)
        elif isinstance(statement, ast.Try):
            blocks = [statement.body, statement.orelse, statement.finalbody]
            for block in [*blocks, *(handler.body for handler in statement.handlers)]:
                found += _import_time_nodes(block)
    return found


def import_time_imports(path: Path) -> set[str]:
    """What importing ``path`` imports: its module-level imports, not those inside functions or
    under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(), str(path))
    package = _package(path)
    return {m for node in _import_time_nodes(tree.body) for m in _resolve(node, package)}


def files(folder: str) -> dict[str, Path]:
    return {module_name(f): f for f in sorted((REPO / folder).rglob("*.py"))}


def graph(folder: str, *, import_time: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of the same folder it imports (anywhere, or at import time only)."""
    found = files(folder)
    read = import_time_imports if import_time else imports
    return {name: {m for m in read(f) if m in found and m != name} for name, f in found.items()}


def packages_excluded(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """A package's ``__init__`` is imported on the way to any of its modules: leave the edges to
    packages out (they import nothing here), keep module-to-module edges."""
    packages = {n for n in graph if (REPO / Path(*n.split(".")[1:]) / "__init__.py").is_file()}
    return {n: deps - packages for n, deps in graph.items()}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
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


def reaches(graph: dict[str, set[str]], start: str, targets: set[str]) -> list[str] | None:
    """A path of imports from ``start`` to one of ``targets`` (``start`` itself included), or
    None when importing ``start`` never imports any of them."""
    paths = {start: [start]}
    todo = [start]
    while todo:
        node = todo.pop()
        if node in targets:
            return paths[node]
        for nxt in sorted(graph.get(node, ())):
            if nxt not in paths:
                paths[nxt] = [*paths[node], nxt]
                todo.append(nxt)
    return None
