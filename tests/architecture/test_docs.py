"""ARCHITECTURE.md names only paths that exist, relative to the repository root."""

from __future__ import annotations

import re
from pathlib import Path

from .graph import REPO

# A backquoted token that looks like a path: a folder (``server/``), a file (``server/serve.py``,
# ``handlers/streaming.py``) or a module's name in it (``server/serving/slot.run_batch``). URLs
# (``/predictions``) and dotted module names (``serving.protocol.WireRequest``) are not paths.
_TOKEN = re.compile(r"`([A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]*)*)`")
_FILE_SUFFIXES = {".py", ".md", ".proto", ".binpb", ".toml", ".yaml", ".yml", ".sh", ".json"}


def _is_path(token: str) -> bool:
    return "/" in token or Path(token).suffix in _FILE_SUFFIXES


def _exists(token: str, root: Path) -> bool:
    if (root / token).exists():
        return True
    # ``folder/module.attribute``: the module's file
    head, _, tail = token.rpartition("/")
    module = tail.split(".", 1)[0]
    return bool(head) and "." in tail and (root / head / f"{module}.py").is_file()


def missing_paths(text: str, root: Path) -> list[str]:
    return sorted({t for t in _TOKEN.findall(text) if _is_path(t) and not _exists(t, root)})


def test_every_path_in_architecture_md_exists() -> None:
    text = (REPO / "ARCHITECTURE.md").read_text()
    assert len([t for t in _TOKEN.findall(text) if _is_path(t)]) > 40
    assert missing_paths(text, REPO) == []


def test_the_path_check_finds_a_missing_path() -> None:
    text = "`http/limits.py`, `server/http/limits.py`, `server/serving/slot.run_batch`, `serve.py`,"
    text += " `/predictions`, `serving.protocol.WireRequest`, `handlers/`, `nowhere/slot.run`"
    assert missing_paths(text, REPO) == ["http/limits.py", "nowhere/slot.run", "serve.py"]
