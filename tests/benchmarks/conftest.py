"""Fixtures: the reference models scripted once per session, with their sample bodies."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from torchbay.benchmarks import runner
from torchbay.benchmarks.loadgen import LoadGenerator


@pytest.fixture(scope="session")
def assets(tmp_path_factory: pytest.TempPathFactory) -> runner.Assets:
    """Scripted tiny/cnn models and one raw body each, as the scenario runner prepares them."""
    return runner.prepare_models(Path(tmp_path_factory.mktemp("bench-assets")))


@pytest.fixture(scope="module")
def gen() -> Iterator[LoadGenerator]:
    """One load-generator process, reused by a module's runs (as run_scenarios reuses it)."""
    with LoadGenerator(1) as generator:
        yield generator


ROOT = Path(__file__).resolve().parents[2]


def load_script(relative: str) -> ModuleType:
    """A study script that lives beside its results (``results/...``, ``scripts/...``): not in
    the package, so tests load it by path, as ``python <path>`` runs it."""
    path = ROOT / relative
    name = "study_" + path.with_suffix("").as_posix().replace("/", "_").replace("-", "_")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module
