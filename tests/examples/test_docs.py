"""The docs as a reader follows them: docs/handlers.md's and the README's code runs, every link
(and its anchor) and every piece of code a doc names resolve, and every example has its README,
build script and served test."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from torchbay.cli import main

from .conftest import example_module

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "handlers.md"
README = REPO / "README.md"
EXAMPLES_DIR = REPO / "examples"
EXAMPLES = sorted(p.name for p in EXAMPLES_DIR.iterdir() if p.is_dir())
DOCS = [
    "README.md",
    "ARCHITECTURE.md",
    *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")),
    *sorted(f"examples/{p.parent.name}/README.md" for p in EXAMPLES_DIR.glob("*/README.md")),
]


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


@pytest.mark.slow
def test_the_readmes_handler_test_runs_on_the_tabular_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README "Writing a handler": its snippet and its `torchbay verify` line, as written, on the
    archive the tabular example builds. A body that is not JSON is the handler's 400, not a 500."""
    monkeypatch.chdir(tmp_path)
    example_module("tabular").build(Path("out/tabular"))
    section = _section(README.read_text(), "Writing a handler")
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    exec(compile(code.group(1), str(README), "exec"), {"__name__": "readme"})
    line = re.search(r"`torchbay verify ([^`]*)`", section)
    assert line is not None
    Path("row.json").write_text("[6.3, 2.9, 5.6, 1.8]")
    Path("bad.json").write_text("not json")
    assert main(["verify", *line.group(1).split()]) == 0  # 1 on a 5xx


def _anchors(path: Path) -> set[str]:
    """The heading anchors GitHub makes for ``path`` (lower case, punctuation dropped, spaces
    to dashes; a repeated heading gets ``-1``, ``-2``, ...)."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    counts: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6}\s+(.*)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(f"{slug}-{counts[slug]}" if slug in counts else slug)
        counts[slug] = counts.get(slug, 0) + 1
    return anchors


@pytest.mark.parametrize("doc", DOCS)
def test_relative_links_resolve(doc: str) -> None:
    """Every relative link of a doc names a file of the repository, and its ``#anchor`` a
    heading of that file (a renamed heading breaks every link to it, silently)."""
    path = REPO / doc
    missing = []
    for target, anchor in re.findall(r"\]\(([^)#:\s]*)(?:#([^)\s]*))?\)", path.read_text()):
        linked = path.parent / target if target else path
        if target and not linked.exists():
            missing.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            missing.append(f"{target}#{anchor}")
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


@pytest.mark.parametrize("doc", DOCS)
def test_the_code_a_doc_names_exists(doc: str) -> None:
    """Every `server/x/y.py` a doc names is a file of the repository, and every `server/x/y.Name`
    a name defined in that module: a reader who looks for it finds it (TorchServe's own paths
    aside)."""
    roots = "server|handlers|archiver|benchmarks|torchbay|examples|tests|scripts|deploy|results"
    text = (REPO / doc).read_text()
    missing = []
    for match in re.finditer(rf"(TorchServe's )?`((?:{roots})/[\w./-]*[\w/])`", text):
        theirs, path = match.groups()  # TorchServe's `examples/...`: its repository's
        if theirs:
            continue
        if not (REPO / path).exists() and not (REPO / doc).parent.joinpath(path).exists():
            module, _, name = path.rpartition(".")
            source = REPO / f"{module}.py"
            defined = rf"^\s*(?:async def|def|class) {name}\b|^{name}\s*[:=]"
            if not (source.is_file() and re.search(defined, source.read_text(), re.M)):
                missing.append(path)
    assert missing == []


@pytest.mark.slow
def test_the_readmes_model_commands_run_in_order(
    serve, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """README "Operate it": its `torchbay models` lines, in order, against a server that serves
    digits 1.0 (the model API on) over a store that also holds digits-v2.mar (digits 2.0, as the
    block's comment makes it). Each exits 0; digits 2.0 is then the only version, the default."""
    from .conftest import _server

    store = tmp_path / "model_store"
    store.mkdir()
    _server.tiny_archive(tmp_path, store, "digits", "tensor")
    v2 = _server.tiny_archive(tmp_path, tmp_path / "v2", "digits", "tensor", version="2.0")
    v2.rename(store / "digits-v2.mar")
    server = serve(store, load_models=["digits=digits.mar"], enable_model_api=True)
    block = _section(README.read_text(), "Operate it")
    commands = re.findall(r"^torchbay (models .*?)(?:\s+#.*)?$", block, re.M)
    assert len(commands) == 6
    for command in commands:
        assert main([*command.split(), "--url", server.management_url]) == 0, command
    capsys.readouterr()
    assert main(["models", "describe", "digits", "--json", "--url", server.management_url]) == 0
    described = json.loads(capsys.readouterr().out)
    assert [(d["modelVersion"], d["isDefault"]) for d in described] == [("2.0", True)]
