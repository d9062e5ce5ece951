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

from torchbay.server.observe import retired

from .conftest import LiveServer, make_config


def _samples(text: str, name: str, model: str) -> list[float]:
    return [
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name and s.labels.get("model") == model
    ]


def _cycles(model_store: Path, name: str, cycles: int, asks: int, **register: str) -> str:
    """``cycles`` times: register ``name`` (probe.mar, one worker, ``register``'s parameters),
    ask it ``asks`` times, unregister it; then no version object of it may be alive. The
    scrape after the cycles."""
    config = make_config(model_store, enable_model_api=True, disable_system_metrics=True)
    live = LiveServer(config).start()
    gone: list[weakref.ref] = []
    params = {"url": "probe.mar", "model_name": name, "initial_workers": 1, **register}
    try:
        with httpx.Client(timeout=120) as client:
            for _ in range(cycles):
                answer = client.post(f"{live.management_url}/models", params=params)
                assert answer.status_code == 200, answer.text
                for _ in range(asks):
                    answer = client.post(f"{live.url}/predictions/{name}", json={"echo": 1})
                    assert answer.status_code == 200, answer.text
                registry = live.server.registry
                assert registry is not None
                gone += [weakref.ref(mv) for mv in registry.all_versions() if mv.name == name]
                answer = client.delete(f"{live.management_url}/models/{name}/1.0")
                assert answer.status_code == 200, answer.text
            text = client.get(f"{live.metrics_url}/metrics").text
    finally:
        live.stop()
    gc.collect()
    assert len(gone) == cycles and [ref for ref in gone if ref() is not None] == []
    return text


@pytest.mark.slow
def test_an_unregistered_version_is_not_kept_alive_by_the_metrics(model_store: Path) -> None:
    text = _cycles(model_store, "churn", 3, 1, synchronous="true")
    assert sum(_samples(text, "torchbay_requests_total", "churn")) == 3


@pytest.mark.slow
def test_an_unregistered_cached_version_is_not_kept_alive_by_the_cache_counters(
    model_store: Path,
) -> None:
    """A version with the response cache counts its hits and misses: the counters' cache of
    labelled children kept each unregistered version (its queue, slots and settings) for good."""
    text = _cycles(model_store, "cached", 2, 2, synchronous="true", response_cache="true")
    # a miss then a hit per cycle: the series stays, and counts on when the version comes back
    assert _samples(text, "torchbay_cache_hits_total", "cached") == [2.0]


@pytest.mark.slow
def test_the_series_of_versions_gone_stay_within_a_bound(model_store: Path) -> None:
    """Ever new names registered, asked and unregistered (a multi-model endpoint): the series
    of the KEEP most recently used versions gone stay, the older ones' go; a registered
    version's series stay whatever its age. Before, every name's stayed for good."""
    config = make_config(model_store, enable_model_api=True, disable_system_metrics=True)
    live = LiveServer(config).start()
    names = [f"gone{i}" for i in range(retired.KEEP + 3)]
    try:
        with httpx.Client(timeout=120) as client:
            register = {"url": "probe.mar", "initial_workers": 0, "synchronous": "true"}
            answer = client.post(f"{live.management_url}/models", params=register)
            assert answer.status_code == 200, answer.text
            client.post(f"{live.url}/predictions/probe", json={})  # 503: no worker
            for name in names:
                params = {**register, "model_name": name}
                answer = client.post(f"{live.management_url}/models", params=params)
                assert answer.status_code == 200, answer.text
                assert client.post(f"{live.url}/predictions/{name}", json={}).status_code == 503
                answer = client.delete(f"{live.management_url}/models/{name}/1.0")
                assert answer.status_code == 200, answer.text
            text = client.get(f"{live.metrics_url}/metrics").text
        seen = {
            s.labels["model"]
            for f in text_string_to_metric_families(text)
            if f.name.startswith("torchbay_")
            for s in f.samples
            if "model" in s.labels
        }
        # The bound is checked when a version first records: the last one was registered then.
        assert seen == {"probe", *names[2:]}
    finally:
        live.stop()
