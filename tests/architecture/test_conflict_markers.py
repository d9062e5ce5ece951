"""No file in the repository keeps a merge's conflict markers (a merge once left them in README.md
and docs/cache.md, and nothing else noticed)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from .graph import REPO

_MARKER = re.compile(
    "^(" + "<" * 7 + "|" + ">" * 7 + ") ", re.MULTILINE
)  # its ======= can be a heading
_TEXT = {".py", ".md", ".txt", ".yaml", ".yml", ".toml", ".json", ".sh", ".proto", ".cfg", ""}


def _tracked(root: Path) -> list[Path]:
    """The repository's files: git's list, or (no git) every file outside hidden folders."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=True
        ).stdout
        return [root / name for name in out.decode().split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        return [p for p in root.rglob("*") if not any(s.startswith(".") for s in p.parts)]


def conflicted(root: Path) -> list[str]:
    found = []
    for path in _tracked(root):
        if path.suffix not in _TEXT or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if _MARKER.search(text):
            found.append(path.relative_to(root).as_posix())
    return found


def test_no_file_keeps_conflict_markers() -> None:
    assert conflicted(REPO) == []


def test_the_check_finds_a_conflict(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("a\n" + "<" * 7 + " HEAD\nb\n" + "=" * 7 + "\nc\n")
    (tmp_path / "ok.md").write_text("a table\n=======\n")  # a heading's underline, not a marker
    assert conflicted(tmp_path) == ["README.md"]
