"""docs/handlers.md and the examples index: the code runs, the links resolve, every example has
its README, build script and served test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "handlers.md"
EXAMPLES = sorted(p.name for p in (REPO / "examples").iterdir() if p.is_dir())


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def test_the_testing_snippet_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    section = _section(GUIDE.read_text(), "Testing without a server")
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    exec(compile(code.group(1), str(GUIDE), "exec"), {"__name__": "guide"})


@pytest.mark.parametrize("doc", ["docs/handlers.md", "README.md"])
def test_relative_links_resolve(doc: str) -> None:
    path = REPO / doc
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", path.read_text())
    assert links
    missing = [link for link in links if not (path.parent / link).exists()]
    assert missing == []


@pytest.mark.parametrize("name", EXAMPLES)
def test_each_example_is_documented_built_and_tested(name: str) -> None:
    folder = REPO / "examples" / name
    assert (folder / "README.md").is_file()
    builds = {"digits": "train.py", "triton": "build_models.py"}
    assert (folder / builds.get(name, "build.py")).is_file()
    tests = REPO / "tests" / "examples"
    assert (tests / f"test_{name}.py").is_file() or (tests / f"test_{name}_examples.py").is_file()
    assert f"(../examples/{name})" in GUIDE.read_text()
    assert f"(examples/{name})" in (REPO / "README.md").read_text()
