"""The recorded workflows' stores, built here by TorchServe's own archivers (the dev extra's
torch-model-archiver 0.12.0 and torch-workflow-archiver 0.2.15), from the files the recording
used (tests/data/torchserve/workflows)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.torchserve_archivers import run_archiver

from .conftest import recorded

DATA = Path(__file__).resolve().parents[1] / "data" / "torchserve" / "workflows"
steps, RECORD = recorded(DATA, "steps.py")
ANSWERS = {a["id"]: a for a in RECORD["answers"]}


def archivers_installed() -> bool:
    return all(
        importlib.util.find_spec(m) is not None for m in ("model_archiver", "workflow_archiver")
    )


# The marks of a test module over these stores: TorchServe's archivers (the dev extra) run as
# subprocesses, and the workers start one after another (minutes on a loaded host).
LIVE_MARKS = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(not archivers_installed(), reason="the archivers (dev extra) are missing"),
]


def _run(module: str, main: str, args: list[str]) -> None:
    code = f"import sys; from {module} import {main}; sys.argv[0] = 'archiver'; {main}()"
    run_archiver([sys.executable, "-c", code, *args], capture_output=True)


def build_model_store(root: Path) -> Path:
    """double.mar and square.mar (node_handler.py; the models are made in code)."""
    root.mkdir(parents=True, exist_ok=True)
    for name in steps.ARCHIVES.values():
        args = ["--model-name", name, "--version", "1.0", "--export-path", str(root)]
        _run("model_archiver.model_packaging", "generate_model_archive",
             [*args, "--handler", str(DATA / "node_handler.py")])  # fmt: skip
    return root


def build_workflow(root: Path, name: str, spec: Path, handler: Path) -> Path:
    """``name.war`` made by torch-workflow-archiver from ``spec`` and ``handler``."""
    root.mkdir(parents=True, exist_ok=True)
    args = ["--workflow-name", name, "--spec-file", str(spec), "--handler", str(handler)]
    _run("workflow_archiver.workflow_packaging", "generate_workflow_archive",
         [*args, "--export-path", str(root)])  # fmt: skip
    return root / f"{name}.war"


def build_workflow_store(root: Path) -> Path:
    for file_name, spec in steps.WORKFLOWS.items():
        build_workflow(
            root, file_name.removesuffix(".war"), DATA / spec, DATA / "workflow_handler.py"
        )
    return root
