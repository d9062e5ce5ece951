"""Fixtures: the reference models scripted once per session, with their sample bodies."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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
