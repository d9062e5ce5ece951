"""Metrics across register and unregister on a live server: a model's series stay (its counters
keep counting when the same name and version come back, as TorchServe's do), and the metrics
keep no unregistered model version alive."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import LiveServer, make_config


def _requests(text: str, model: str) -> float:
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "torchbay_requests_total" and s.labels.get("model") == model
    )


@pytest.mark.slow
def test_an_unregistered_version_is_not_kept_alive_by_the_metrics(model_store: Path) -> None:
    config = make_config(model_store, enable_model_api=True, disable_system_metrics=True)
    live = LiveServer(config).start()
    gone: list[weakref.ref] = []
    params = {"url": "probe.mar", "model_name": "churn", "initial_workers": 1}
    try:
        with httpx.Client(timeout=120) as client:
            for _ in range(3):
                register = f"{live.management_url}/models"
                answer = client.post(register, params={**params, "synchronous": "true"})
                assert answer.status_code == 200, answer.text
                assert client.post(f"{live.url}/predictions/churn", json={}).status_code == 200
                registry = live.server.registry
                assert registry is not None
                gone += [weakref.ref(mv) for mv in registry.all_versions() if mv.name == "churn"]
                answer = client.delete(f"{live.management_url}/models/churn/1.0")
                assert answer.status_code == 200, answer.text
            text = client.get(f"{live.metrics_url}/metrics").text
        gc.collect()
        assert len(gone) == 3 and [ref for ref in gone if ref() is not None] == []
        assert _requests(text, "churn") == 3
    finally:
        live.stop()
