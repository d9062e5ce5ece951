"""Start-up models: named twice (load_models and a models={...} entry) load once; every version
of a models={...} entry loads, its default the default."""

from __future__ import annotations

import httpx
import pytest

from .conftest import probe_models, running

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("load_models", [["probe.mar"], ["all"]])
def test_an_archive_in_load_models_and_models_loads_once(live_server, load_models):
    server = live_server(load_models=load_models, models=probe_models(batchSize=2))
    assert server.server.state.failed_models == {}
    described = httpx.get(f"{server.management_url}/models/probe", timeout=30).json()
    assert [d["modelVersion"] for d in described] == ["1.0"]
    assert described[0]["batchSize"] == 2  # the models= entry's settings apply
    assert httpx.post(f"{server.url}/predictions/probe", json={"echo": 1}, timeout=30).is_success


def test_every_version_of_a_models_entry_loads_with_its_default(versioned_store):
    """A snapshot's model with two versions (TorchServe restores each, and its default)."""
    models = {
        "probe": {
            "1.0": {"marName": "probe.mar", "defaultVersion": False},
            "2.0": {"marName": "probe-v2.mar", "defaultVersion": True, "batchSize": 3},
        }
    }
    with running(versioned_store, models=models) as server:
        assert server.server.state.failed_models == {}
        management = server.management_url
        described = httpx.get(f"{management}/models/probe/all", timeout=30).json()
        assert sorted(d["modelVersion"] for d in described) == ["1.0", "2.0"]
        (default,) = httpx.get(f"{management}/models/probe", timeout=30).json()
        assert (default["modelVersion"], default["batchSize"]) == ("2.0", 3)
