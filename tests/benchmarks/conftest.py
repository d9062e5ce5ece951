"""Fixtures: the reference models scripted once per session, with their sample bodies."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchbay.benchmarks import runner


@pytest.fixture(scope="session")
def assets(tmp_path_factory: pytest.TempPathFactory) -> runner.Assets:
    """Scripted tiny/cnn models and one raw body each, as the scenario runner prepares them."""
    return runner.prepare_models(Path(tmp_path_factory.mktemp("bench-assets")))
