"""TorchServe 0.12's ``context.metrics`` API as a handler may misuse it: the same requests
(tests/data/torchserve/metrics_api/api_handler.py, one per case of record.py's CASES) run
against a live torchbay with ``model_metrics_auto_detect`` in prometheus and log mode, and
compared with what TorchServe 0.12 answered, published and logged (answers.json, made by
record.py there).

Compared: each request's status and answer (a metric the handler got wrong is TorchServe's
logged error, never a failed request), the /metrics samples of the handler's families, and the
handler's lines of ``model_metrics.log``.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import (
    LiveServer,
    make_config,
    recorded,
    recorded_store,
    with_metrics_logs,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "torchserve" / "metrics_api"
record, RECORD = recorded(DATA, "record.py")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recorder's model store (api.mar), built by torchbay's archiver."""
    archives = {"api.mar": ("api", "1.0", "api_handler.py")}
    return recorded_store(tmp_path_factory, "metrics-api", archives, DATA)


def run_mode(store: Path, logs: Path, mode: str) -> dict[str, Any]:
    """Start torchbay in ``mode``, make every request, scrape, stop it, read its model log."""
    models = {"api": {"1.0": {"marName": "api.mar"}}}
    config = make_config(
        store,
        models=models,
        metrics_mode=mode,
        model_metrics_auto_detect=True,
        disable_system_metrics=True,
    )
    server = LiveServer(config).start()
    answers = {}
    try:
        with httpx.Client(timeout=120) as client:
            for case in record.CASES:
                url = f"{server.url}/predictions/api"
                response = client.post(url, content=case.encode())
                answers[case] = {"status": response.status_code, "body": response.json()}
            scrape = client.get(f"{server.metrics_url}/metrics").text
    finally:
        server.stop()  # the metrics log's writer is flushed and closed
    model_log = logs / "model_metrics.log"
    found = {"answers": answers, "samples": record.samples(scrape)}
    found["log"] = record.log_lines(model_log.read_text()) if model_log.exists() else []
    return found


@pytest.fixture(scope="module", params=["prometheus", "log"])
def mode(
    request: pytest.FixtureRequest, store: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, dict[str, Any]]:
    run = partial(run_mode, store, mode=request.param)
    return with_metrics_logs(tmp_path_factory, "metrics-api-logs", request.param, run)


def test_record_is_torchserve_0_12() -> None:
    assert RECORD["torchserve"] == "0.12.0"
    assert RECORD["command"].endswith("tests/data/torchserve/metrics_api/record.py")
    assert set(RECORD["modes"]) == {"prometheus", "log"}


@pytest.mark.parametrize("case", record.CASES)
def test_same_answer(mode: tuple[str, dict[str, Any]], case: str) -> None:
    """A metric the handler got wrong (a dimension count, a value that is no number) is logged
    and dropped; get_metric of an unknown metric raises TorchServe's MetricsCacheKeyError."""
    name, got = mode
    assert got["answers"][case] == RECORD["modes"][name]["answers"][case]


def test_same_handler_samples(mode: tuple[str, dict[str, Any]]) -> None:
    name, got = mode
    assert got["samples"] == RECORD["modes"][name]["samples"]


def test_same_model_metrics_log_lines(mode: tuple[str, dict[str, Any]]) -> None:
    name, got = mode
    assert got["log"] == RECORD["modes"][name]["log"]
