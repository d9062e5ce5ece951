"""The import rules inside handlers/ and archiver/ (the server's are test_imports.py): no cycles;
a handler author's modules reach ``handlers/runtime`` only through its two seams; the archiver's
layers import one way; the modules said to be torch-free import no torch when imported. Each rule
has a test that it can fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .graph import REPO, cycle, files, graph, import_time_imports, packages_excluded, reaches

RUNTIME = "torchbay.handlers.runtime"

# The author-facing modules that import the runtime, and what each may import of it.
SEAMS = {
    # BaseHandler loads its model and runs it as the worker does (initialize, run_model), and
    # compiles it as model-config.yaml's pt2 asks; its map_items answers 400 for a body that
    # did not decode (envelopes.Undecoded, handed to other handlers raw as TorchServe does)
    "torchbay.handlers.base_handler": {
        f"{RUNTIME}.loading",
        f"{RUNTIME}.accel",
        f"{RUNTIME}.pt2",
        f"{RUNTIME}.envelopes",
    },
    # the image and text classifiers' explanations (Captum, an optional extra)
    "torchbay.handlers.image_classifier": {f"{RUNTIME}.explain"},
    "torchbay.handlers.text_classifier": {f"{RUNTIME}.explain"},
    # the test helper runs a handler through the worker's own Service
    "torchbay.handlers.testing": {f"{RUNTIME}.service", f"{RUNTIME}.resolve", f"{RUNTIME}.loading"},
}

# The archiver's layers, and which layers each may import (its own always).
ARCHIVER_LAYERS = {
    "core": {"errors", "limits", "manifest", "signature", "signature_sources", "extract", "war"}
    | {"inspect", "write", "options"},  # torch-free: reading, checking and writing archives
    "model": {"aoti", "build", "convert", "parity", "record_signature"},  # torch: the model
    "commands": {"package", "verify", "cli"},  # torch only inside functions, through "model"
}
ARCHIVER_ALLOWED = {"core": {"core"}, "model": {"core"}, "commands": {"core", "model"}}

# Importing these imports no torch (torch, where they need it, is imported inside functions).
TORCH_FREE = sorted(
    [f"torchbay.handlers.{m}" for m in ("context", "errors", "metrics", "oip_signature")]
    + [f"torchbay.handlers.{m}" for m in ("streaming", "utils", "testing")]
    + [f"{RUNTIME}.{m}" for m in ("envelopes", "oip", "oip_binary", "oip_encoding")]
    + [f"{RUNTIME}.{m}" for m in ("oip_response", "resolve", "responses", "service", "streams")]
    + [f"torchbay.archiver.{m}" for m in ARCHIVER_LAYERS["core"] | ARCHIVER_LAYERS["commands"]]
    + ["torchbay.handlers", RUNTIME, "torchbay.archiver"]
)


def _is_runtime(module: str) -> bool:
    return module == RUNTIME or module.startswith(RUNTIME + ".")


def _runtime_crossings(graph: dict[str, set[str]], seams: dict[str, set[str]]) -> list[str]:
    """Imports of the runtime by an author-facing module that no seam allows."""
    return [
        f"{source} imports {target}"
        for source, targets in sorted(graph.items())
        if source.startswith("torchbay.handlers") and not _is_runtime(source)
        for target in sorted(targets)
        if _is_runtime(target) and target not in seams.get(source, set())
    ]


def _layer_of(module: str, layers: dict[str, set[str]]) -> str | None:
    short = module.rsplit(".", 1)[-1]
    return next((layer for layer, names in layers.items() if short in names), None)


def _layer_violations(
    graph: dict[str, set[str]], layers: dict[str, set[str]], allowed: dict[str, set[str]]
) -> list[str]:
    """Imports that go against the layers (a module in no layer is one too)."""
    wrong = [f"{m} is in no layer" for m in sorted(graph) if _layer_of(m, layers) is None]
    for source, targets in sorted(graph.items()):
        here = _layer_of(source, layers)
        for target in sorted(targets):
            there = _layer_of(target, layers)
            if here and there and there != here and there not in allowed[here]:
                wrong.append(f"{source} ({here}) imports {target} ({there})")
    return wrong


@pytest.mark.parametrize("folder", ["handlers", "archiver"])
def test_no_import_cycles(folder: str) -> None:
    found_graph = packages_excluded(graph(folder))
    assert len(found_graph) > 10
    found = cycle(found_graph)
    assert found is None, "import cycle: " + " -> ".join(found or [])


def test_author_modules_reach_the_runtime_only_through_its_seams() -> None:
    handlers = packages_excluded(graph("handlers"))
    assert not _runtime_crossings(handlers, SEAMS)
    # a seam no longer used is dropped from SEAMS, not left to allow a later import
    for source, targets in SEAMS.items():
        assert targets <= {t for t in handlers[source] if _is_runtime(t)}, source


def test_the_seam_rule_finds_a_crossing() -> None:
    runtime_edge = {"torchbay.handlers.context": {f"{RUNTIME}.service"}}
    assert _runtime_crossings(runtime_edge, SEAMS) == [
        f"torchbay.handlers.context imports {RUNTIME}.service"
    ]
    assert _runtime_crossings({"torchbay.handlers.testing": {f"{RUNTIME}.service"}}, SEAMS) == []
    assert _runtime_crossings({f"{RUNTIME}.service": {"torchbay.handlers.context"}}, SEAMS) == []


def test_the_archiver_layers_import_one_way() -> None:
    archiver = packages_excluded(graph("archiver"))
    archiver.pop("torchbay.archiver")  # the package: imports nothing
    assert not _layer_violations(archiver, ARCHIVER_LAYERS, ARCHIVER_ALLOWED)


def test_the_layer_rule_finds_a_wrong_import() -> None:
    core_to_model = {"torchbay.archiver.manifest": {"torchbay.archiver.build"}}
    assert _layer_violations(core_to_model, ARCHIVER_LAYERS, ARCHIVER_ALLOWED) == [
        "torchbay.archiver.manifest (core) imports torchbay.archiver.build (model)"
    ]
    unplaced = {"torchbay.archiver.newcomer": set()}
    assert _layer_violations(unplaced, ARCHIVER_LAYERS, ARCHIVER_ALLOWED) == [
        "torchbay.archiver.newcomer is in no layer"
    ]


def _import_time_graph() -> dict[str, set[str]]:
    """What importing each module of handlers/ and archiver/ imports, torch as one node."""
    known: dict[str, Path] = {**files("handlers"), **files("archiver")}
    found: dict[str, set[str]] = {}
    for name, path in known.items():
        imported = import_time_imports(path)
        found[name] = {m for m in imported if m in known and m != name}
        if any(m == "torch" or m.startswith("torch.") for m in imported):
            found[name].add("torch")
    return found


@pytest.mark.parametrize("module", TORCH_FREE)
def test_torch_free_modules_import_no_torch(module: str) -> None:
    path = reaches(_import_time_graph(), module, {"torch"})
    assert path is None, " imports ".join(path or [])


def test_the_torch_rule_finds_a_path_to_torch() -> None:
    assert reaches({"a": {"b"}, "b": {"torch"}}, "a", {"torch"}) == ["a", "b", "torch"]
    assert reaches({"a": {"b"}, "b": set()}, "a", {"torch"}) is None


def test_torch_free_modules_import_no_torch_when_run() -> None:
    """The same rule in a fresh interpreter: what the graph above cannot see (a module that
    imports torch through a package outside handlers/ and archiver/) shows here."""
    code = "; ".join(
        [
            "import importlib, sys",
            f"[importlib.import_module(m) for m in {TORCH_FREE!r}]",
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))",
        ]
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=100
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
