"""Start-up models named twice (load_models and a models={...} entry) load once."""

from __future__ import annotations

import httpx
import pytest

from .conftest import probe_models

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("load_models", [["probe.mar"], ["all"]])
def test_an_archive_in_load_models_and_models_loads_once(live_server, load_models):
    server = live_server(load_models=load_models, models=probe_models(batchSize=2))
    assert server.server.state.failed_models == {}
    described = httpx.get(f"{server.management_url}/models/probe", timeout=30).json()
    assert [d["modelVersion"] for d in described] == ["1.0"]
    assert described[0]["batchSize"] == 2  # the models= entry's settings apply
    assert httpx.post(f"{server.url}/predictions/probe", json={"echo": 1}, timeout=30).is_success
