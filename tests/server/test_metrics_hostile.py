"""Handler metrics that /metrics and the metrics logs must survive, on a live server.

TorchServe's model metrics with ``model_metrics_auto_detect`` take a handler's names, units,
dimension names and values as they come (observe.ts_families). A name or dimension Prometheus
cannot write, a unit with a line break, a NaN gauge, a name of torchbay's own families: each must
leave every scrape parseable by prometheus_client, with one TYPE line per family (a name that
auto-detect refuses goes to torchbay's own registry, which must survive it too), and every line
of ``model_metrics.log`` (``log`` mode) one line in TorchServe's format.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import ASSETS, LiveServer, build_store, make_config

MODELS = {"metric": {"1.0": {"marName": "metric.mar"}}}
# What the metric handler (assets/metric_handler.py) is asked to record, one request each.
HOSTILE = [
    {"name": "a\nb", "value": 1, "type": "gauge"},
    {"name": "spaced name", "value": 1},
    {"name": "dims", "value": 1, "dims": {"bad-dim": "x"}},
    {"name": "unit", "value": 2, "type": "gauge", "unit": "ms\nTYPE x\\y"},
    {"name": "quoted", "value": 1, "dims": {"Color": 'r"e\\d\nx'}},
    {"name": "nan", "value": float("nan"), "type": "gauge"},
    {"name": "neg_inf", "value": float("-inf"), "type": "gauge"},
    {"name": "torchbay_requests_total", "value": 1},
    {"name": "torchbay_batch_size_count", "value": 1, "type": "gauge"},
    {"name": "h", "value": 1, "type": "histogram", "dims": {"le": "1"}},
    # A lone surrogate (a client's JSON string copied into a metric) is no UTF-8 text.
    {"name": "surrogate", "value": 1, "dims": {"Color": "\ud800"}},
    {"name": "surrogate\udc80name", "value": 1, "unit": "\ud800"},
]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory, "hostile", {"metric": str(ASSETS / "metric_handler.py")})


@pytest.fixture(scope="module")
def server(store: Path) -> Iterator[LiveServer]:
    config = make_config(
        store, models=MODELS, model_metrics_auto_detect=True, disable_system_metrics=True
    )
    live = LiveServer(config).start()
    yield live
    live.stop()


def record(client: httpx.Client, server: LiveServer, metric: dict[str, Any]) -> None:
    body = json.dumps({"metrics": [metric]})  # NaN and -Infinity: Python's JSON reads them
    url = f"{server.url}/predictions/metric"
    response = client.post(url, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("metric", HOSTILE, ids=lambda m: repr(m["name"]))
def test_a_hostile_handler_metric_leaves_metrics_parseable(
    server: LiveServer, metric: dict[str, Any]
) -> None:
    with httpx.Client(timeout=60) as client:
        record(client, server, metric)
        response = client.get(f"{server.metrics_url}/metrics")
    assert response.status_code == 200, response.text
    families = list(text_string_to_metric_families(response.text))
    assert any(f.name == "ts_inference_requests" for f in families)
    types = Counter(line.split()[2] for line in response.text.splitlines() if line[:6] == "# TYPE")
    assert [name for name, count in types.items() if count > 1] == []


@pytest.mark.parametrize(
    ("first", "then"),
    [
        ({"name": "clash-g", "type": "gauge"}, {"name": "clash_g", "type": "gauge"}),
        ({"name": "clash-c"}, {"name": "clash_c_total"}),
        ({"name": "clash-h", "type": "histogram"}, {"name": "clash_h", "type": "gauge"}),
        ({"name": "clash-s", "type": "histogram"}, {"name": "clash_s_sum", "type": "gauge"}),
        ({"name": "rev_h", "type": "histogram"}, {"name": "rev-h_count", "type": "gauge"}),
    ],
    ids=["gauge", "counter", "histogram", "histogram-sample", "detected-first"],
)
def test_a_detected_name_never_doubles_a_family_that_torchbay_wrote_first(
    server: LiveServer, first: dict[str, Any], then: dict[str, Any]
) -> None:
    """A name auto-detect refuses (``clash-g``) goes to torchbay's registry, sanitised
    (``clash_g``); a later metric of that very name (or of one of its samples) must not be
    detected too, nor may torchbay's registry take a detected histogram's sample name
    (``rev_h_count``): a second family of one name makes Prometheus reject the whole scrape."""
    base = first["name"].replace("-", "_")
    with httpx.Client(timeout=60) as client:
        record(client, server, {**first, "value": 1})
        record(client, server, {**then, "value": 1})
        text = client.get(f"{server.metrics_url}/metrics").text
    list(text_string_to_metric_families(text))  # parseable
    families: dict[str, set[str]] = {}  # a name of this case's -> the families that write it
    family = ""
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            family = line.split()[2]
            if family.startswith(base):
                assert family not in families, f"a second family {family}"
                families[family] = {family}
        elif line and not line.startswith("#") and line.startswith(base):
            families.setdefault(line.split("{")[0].split()[0], set()).add(family)
    assert {name: fams for name, fams in families.items() if len(fams) > 1} == {}


def test_a_detected_name_never_doubles_a_host_metric(store: Path, tmp_path: Path) -> None:
    """A metrics_config without the host metrics in ``ts_metrics`` (TorchServe would publish
    none then; torchbay's host collector still does, system metrics on): a handler's
    ``CPUUtilization`` must not be auto-detected beside the host collector's family."""
    config_file = tmp_path / "metrics.yaml"
    config_file.write_text("ts_metrics:\n  counter:\n    - {name: Requests2XX, unit: Count}\n")
    config = make_config(
        store, models=MODELS, model_metrics_auto_detect=True, metrics_config=config_file
    )
    live = LiveServer(config).start()
    try:
        with httpx.Client(timeout=60) as client:
            record(client, live, {"name": "CPUUtilization", "value": 1, "type": "gauge"})
            text = client.get(f"{live.metrics_url}/metrics").text
    finally:
        live.stop()
    list(text_string_to_metric_families(text))  # parseable
    assert text.count("# TYPE CPUUtilization ") == 1, text


def test_a_handler_gauge_at_nan_keeps_its_last_finite_value(server: LiveServer) -> None:
    """TorchServe 0.12 drops a NaN or infinite value (its frontend cannot parse ``nan``: the
    metrics_api record's ``gauge_then_nan``); it was written as ``NaN``."""
    with httpx.Client(timeout=60) as client:
        for value in (2.5, float("nan"), float("inf")):
            record(client, server, {"name": "nan_gauge", "value": value, "type": "gauge"})
        text = client.get(f"{server.metrics_url}/metrics").text
    assert re.search(
        r'^nan_gauge\{ModelName="metric",Level="Model",Hostname=".*",\} 2.5$', text, re.M
    )


def test_a_negative_increment_leaves_a_handler_counter_as_it_was(server: LiveServer) -> None:
    """A Prometheus counter never decreases (``rate()`` reads a decrease as a reset);
    TorchServe's client refuses a negative increment, and so does this: the event is dropped."""
    pattern = r'^down_counter\{ModelName="metric",Level="Model",Hostname=".*",\} (\S+)$'
    with httpx.Client(timeout=60) as client:
        for value in (3, -5, float("nan"), 1):
            record(client, server, {"name": "down_counter", "value": value})
        text = client.get(f"{server.metrics_url}/metrics").text
    found = re.search(pattern, text, re.M)
    assert found is not None and float(found.group(1)) == 4.0


def test_log_mode_lines_stay_one_line_each(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("METRICS_LOCATION", str(tmp_path))
    config = make_config(
        store,
        models=MODELS,
        model_metrics_auto_detect=True,
        disable_system_metrics=True,
        metrics_mode="log",
    )
    live = LiveServer(config).start()
    try:
        with httpx.Client(timeout=60) as client:
            for metric in HOSTILE[:5]:
                record(client, live, metric)
    finally:
        live.stop()
    lines = (tmp_path / "model_metrics.log").read_text().splitlines()
    line = re.compile(r"^\d{4}-\d\d-\d\dT[\d:]{8},\d{3} - .+\|#.*\|#hostname:.+,timestamp:\d+$")
    assert [text for text in lines if not line.match(text)] == []
    assert any(text.startswith(r"a\nb.") for text in (t.split(" - ", 1)[1] for t in lines))


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_loses_metrics_lines_but_not_the_writer_nor_the_stop(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every write of the metrics logs fails (ENOSPC): the lines are lost with one warning per
    file, the writer thread drains on (no queue growing per request) and the server stops."""
    for name in ("ts_metrics.log", "model_metrics.log"):
        (tmp_path / name).symlink_to("/dev/full")
    monkeypatch.setenv("METRICS_LOCATION", str(tmp_path))
    config = make_config(store, models=MODELS, disable_system_metrics=True, metrics_mode="log")
    live = LiveServer(config).start()
    metrics_log = live.server.metrics.ts.log
    try:
        with httpx.Client(timeout=60) as client:
            for _ in range(2):
                for _ in range(5):
                    record(client, live, {"name": "n", "value": 1})
                deadline = time.monotonic() + 30
                while metrics_log._queue.qsize() and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert metrics_log._queue.qsize() == 0
    finally:
        live.stop()  # closing the files must not raise either
    assert caplog.text.count("metrics lines lost") == 2
