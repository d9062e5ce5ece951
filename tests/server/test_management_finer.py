"""The management API's finer points on a live server, over REST and gRPC, where torchbay once
answered otherwise than TorchServe 0.12 (its answers: tests/data/torchserve_0.12/versions, the
whole sequence compared by test_torchserve_versions.py)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import httpx
import pytest

from tests.server.conftest import LiveServer, make_config, tiny_archive

HANDLER = Path(__file__).resolve().parents[1] / "data" / "torchserve_0.12" / "parity_handler.py"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    store = tmp_path_factory.mktemp("finer-store")
    work = tmp_path_factory.mktemp("finer-build")
    shutil.move(tiny_archive(work, work / "out", "tiny", str(HANDLER)), store / "tiny.mar")
    live = LiveServer(make_config(store, enable_model_api=True)).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{live.server.state.ports.grpc_management}")
    try:
        with httpx.Client(base_url=live.management_url, timeout=120) as http:
            yield SimpleNamespace(http=http, channel=channel)
    finally:
        channel.close()
        live.stop()


def _describe(server: SimpleNamespace, name: str) -> dict[str, Any]:
    response = server.http.get(f"/models/{name}")
    assert response.status_code == 200, response.text
    return response.json()[0]


def _register(server: SimpleNamespace, name: str, **params: Any) -> None:
    params = {"url": "tiny.mar", "model_name": name, **params}
    response = server.http.post("/models", params=params)
    assert response.status_code == 200, response.text


def test_describe_shows_whole_numbers_as_integers(server: SimpleNamespace) -> None:
    """TorchServe describes ``"maxBatchDelay": 100``; torchbay said ``100.0`` (its settings take
    decimals), which a client decoding into an integer field (Go, serde) refuses."""
    _register(server, "whole")
    _register(server, "decimal", max_batch_delay="2.5")
    whole, decimal = _describe(server, "whole"), _describe(server, "decimal")
    for key, value in {
        "batchSize": 1, "maxBatchDelay": 100, "responseTimeout": 120, "startupTimeout": 120,
        "maxRetryTimeoutInSec": 300, "clientTimeoutInMills": 0, "minWorkers": 0,
    }.items():  # fmt: skip
        assert (key, whole[key], type(whole[key])) == (key, value, int)
    assert '"maxBatchDelay":100,' in server.http.get("/models/whole").text.replace(" ", "")
    assert decimal["maxBatchDelay"] == 2.5  # a decimal one stays what was asked


def test_describe_shows_the_runtime_registered(server: SimpleNamespace) -> None:
    """``runtime=python3`` at registration: TorchServe describes ``"runtime": "python3"``;
    torchbay always said ``python``. Without it: the archive's (``python``)."""
    _register(server, "rt3", runtime="python3")
    _register(server, "rt")
    assert _describe(server, "rt3")["runtime"] == "python3"
    assert _describe(server, "rt")["runtime"] == "python"
