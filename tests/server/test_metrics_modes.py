"""TorchServe 0.12's metrics modes: the same calls (tests/data/torchserve/metrics_modes/
sequence.py) run against a live torchbay in each recorded case (``metrics_mode`` log,
prometheus and legacy; a custom ``metrics_config``; ``model_metrics_auto_detect`` in Prometheus
and log mode) and compared with what TorchServe 0.12 answered and logged (answers.json, made by
record.py there).

Compared: every status code; the /metrics text of TorchServe's families (which exist, their
types, label names and order, the counts: Requests2XX/4XX/5XX, ts_inference_requests_total, the
handler's InferenceCount); the lines of ``ts_metrics.log`` and ``model_metrics.log`` with hosts,
times, request ids and timed values replaced. torchbay's own families (``torchbay_*``, and a
handler metric TorchServe drops, which torchbay's registry keeps with labels ``model`` and
``version``) are left out of the comparison.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import recorded, recorded_store, tiny_archive, with_metrics_logs
from torchbay.server.config.metrics_config import load_metrics_config
from torchbay.server.observe.ts_families import SYSTEM

DATA = Path(__file__).resolve().parents[1] / "data" / "torchserve" / "metrics_modes"
sequence, RECORD = recorded(DATA, "sequence.py")
# TorchServe writes HELP and TYPE of its host metrics with no sample even when they are
# disabled; torchbay's host collector (observe.system_metrics) writes them only when enabled:
# the recorded types are compared without ts_families.SYSTEM, the host families.


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recorder's model store (counted.mar), built by torchbay's archiver."""
    archives = {sequence.ARCHIVE: ("counted", "1.0", "metrics_handler.py")}
    return recorded_store(tmp_path_factory, "metrics", archives, DATA)


def run_case(store: Path, logs: Path, case: str) -> dict[str, Any]:
    """Start torchbay as the case's config says, make every call, stop it, read its logs."""
    from tests.server.conftest import LiveServer, make_config

    lines = dict(sequence.CASES[case])
    if "metrics_config" in lines:
        lines["metrics_config"] = str(DATA / lines["metrics_config"])
    config = make_config(store, enable_model_api=True, disable_system_metrics=True, **lines)
    server = LiveServer(config).start()
    bases = {
        sequence.INF: server.url,
        sequence.M: server.management_url,
        sequence.X: server.metrics_url,
    }
    answers = []
    try:
        with httpx.Client(timeout=120) as client:
            for step in sequence.STEPS:
                body = step.get("body")
                headers = {"content-type": "text/plain"} if body is not None else {}
                url = bases[step["listener"]] + step["path"]
                response = client.request(step["method"], url, content=body, headers=headers)
                text = response.text
                parsed = sequence.metrics_text(text) if step["listener"] == sequence.X else None
                answers.append({"id": step["id"], "status": response.status_code, "body": parsed})
    finally:
        server.stop()  # the metrics log's writer is flushed and closed
    found = {}
    for name in ("ts_metrics.log", "model_metrics.log"):
        path = logs / name
        found[name] = sequence.log_lines(path.read_text()) if path.exists() else None
    return {"answers": answers, "logs": found}


@pytest.fixture(scope="module", params=list(sequence.CASES))
def case(
    request: pytest.FixtureRequest, store: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, dict[str, Any]]:
    run = partial(run_case, store, case=request.param)
    return with_metrics_logs(tmp_path_factory, "metrics-logs", request.param, run)


def _families(body: dict[str, Any], ts_names: set[str]) -> dict[str, Any]:
    """The families TorchServe could write (not torchbay_*), as types and samples."""
    types = {k: v for k, v in body["types"].items() if k in ts_names}
    samples = [s for s in body["samples"] if s[0] in ts_names]
    return {"types": types, "samples": samples}


def test_record_is_torchserve_0_12() -> None:
    assert RECORD["torchserve"] == "0.12.0"
    assert RECORD["command"].endswith("tests/data/torchserve/metrics_modes/record.py")
    assert set(RECORD["cases"]) == set(sequence.CASES)
    for answered in RECORD["cases"].values():
        assert [a["id"] for a in answered["answers"]] == [s["id"] for s in sequence.STEPS]


def test_same_status_codes(case: tuple[str, dict[str, Any]]) -> None:
    name, got = case
    want = {a["id"]: a["status"] for a in RECORD["cases"][name]["answers"]}
    have = {a["id"]: a["status"] for a in got["answers"]}
    assert have == want


def test_same_metrics_text(case: tuple[str, dict[str, Any]]) -> None:
    """TorchServe's families on /metrics: the same names, types, labels and counts."""
    name, got = case
    recorded = {a["id"]: a for a in RECORD["cases"][name]["answers"]}
    config = sequence.CASES[name].get("metrics_config")
    spec = load_metrics_config(DATA / config if config else None)
    for answer in got["answers"]:
        if answer["body"] is None:
            continue
        want = recorded[answer["id"]]["body"]
        # What torchbay writes as TorchServe would: the config's families and TorchServe's.
        ts_names = set(want["types"]) | set(spec.frontend) | set(spec.model)
        have = _families(answer["body"], ts_names)
        want_types = {k: v for k, v in want["types"].items() if k not in SYSTEM}
        assert have["types"] == want_types, answer["id"]
        assert have["samples"] == want["samples"], answer["id"]
        if "InferenceCount" not in want["types"]:  # dropped by TorchServe: torchbay's own form
            extra = [s for s in answer["body"]["samples"] if s[0].startswith("InferenceCount")]
            assert all(dict(s[1]).get("model") == "counted" for s in extra), extra


def test_same_log_lines(case: tuple[str, dict[str, Any]]) -> None:
    """ts_metrics.log and model_metrics.log: the same lines (none outside log and legacy)."""
    name, got = case
    want = RECORD["cases"][name]["logs"]
    for log_name, lines in want.items():
        assert (got["logs"][log_name] or []) == (lines or []), log_name


@pytest.mark.slow
def test_an_auto_detected_metric_never_breaks_the_page(tmp_path: Path) -> None:
    """A handler metric Prometheus cannot name (``model_metrics_auto_detect``, prometheus mode)
    goes to torchbay's registry, its names made Prometheus's; a unit with a line break stays
    in its HELP line: every scraper still reads the whole page."""
    from prometheus_client.parser import text_string_to_metric_families

    from tests.server.conftest import ASSETS, LiveServer, make_config

    handler = str(ASSETS / "metric_handler.py")
    tiny_archive(tmp_path, tmp_path / "store", "metric", handler)
    models = {"metric": {"1.0": {"marName": "metric.mar"}}}
    config = make_config(tmp_path / "store", models=models, model_metrics_auto_detect=True)
    server = LiveServer(config).start()
    metrics = [
        {"name": "my-metric.v2", "value": 1, "dims": {"Model Name": "x"}},
        {"name": "Twice", "value": 1, "dims": {"Hostname": "x"}},
        {"name": "Kept", "value": 1, "unit": "ms\n# TYPE Kept gauge", "dims": {"A": "x"}},
    ]
    try:
        url = f"{server.url}/predictions/metric"
        assert httpx.post(url, json={"metrics": metrics}, timeout=60).status_code == 200
        page = httpx.get(f"{server.metrics_url}/metrics", timeout=30).text
    finally:
        server.stop()
    names = {family.name for family in text_string_to_metric_families(page)}
    assert {"Kept", "my_metric_v2", "Twice"} <= names, names
