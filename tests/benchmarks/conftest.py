"""Fixtures: the reference models scripted once per session, with their sample bodies."""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchbay.benchmarks import runner
from torchbay.benchmarks.loadgen import LoadGenerator


@pytest.fixture(scope="session")
def assets(tmp_path_factory: pytest.TempPathFactory) -> runner.Assets:
    """Scripted tiny/cnn models and one raw body each, as round two's runner prepares them."""
    return runner.prepare_models(Path(tmp_path_factory.mktemp("bench-assets")))


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(tiny.mar built by our archiver with the raw handler, one raw body file)."""
    out = tmp_path_factory.mktemp("tb-bench")
    assets = runner.prepare_models(out)
    only = runner.Assets(pt={"tiny": assets.pt["tiny"]}, body={"tiny": assets.body["tiny"]})
    archived = runner.archive_models(only, out, sys.executable)
    assert archived.model_store is not None
    return archived.model_store / "tiny.mar", assets.body["tiny"]


@pytest.fixture(scope="module")
def gen() -> Iterator[LoadGenerator]:
    """One load-generator process, reused by a module's runs (as a table's rows reuse it)."""
    with LoadGenerator(1) as generator:
        yield generator


def load_study(path: str) -> types.ModuleType:
    """A study script (results/..., scripts/...: outside the package) loaded by its path from the
    repository root, so that its test exercises the script as it is run."""
    file = Path(__file__).resolve().parents[2] / path
    name = "study_" + path.removesuffix(".py").replace("/", "_")  # "run", "bench": not unique
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while defining
    spec.loader.exec_module(module)
    return module
