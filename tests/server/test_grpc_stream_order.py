"""Triton's ModelStreamInfer answers a non-decoupled model's requests in the order they came
(its stream handler queues each request's response behind the one before), whatever order
they finish in. tritonclient's stream callback gets an error with no request id, so that order
is how a client tells which request failed. Here the first request is held in its handler
(tests/server/assets/gate_handler.py) while a request to another model, and one to a model
that does not exist, are answered; before, their answers overtook the held one's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc

from .conftest import LiveServer, gate_server, ran_ids, until

pytestmark = pytest.mark.slow

ONE = {"minWorkers": 1, "maxWorkers": 1, "batchSize": 1}
MODELS = {name: {"1.0": {"marName": f"{name}.mar", **ONE}} for name in ("held", "quick")}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with gate_server(tmp_path_factory, "stream-order", MODELS) as live:
        yield live


def _text(body: dict[str, Any]) -> list[Any]:
    tensor = triton_grpc.InferInput("text", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([json.dumps(body).encode()], dtype=object))
    return [tensor]


def _ran_and_idle(server: LiveServer, model: str, log: Path) -> bool:
    """``model``'s handler ran the request ``log`` names and its worker is free again: the
    answer is back in the frontend."""
    described = httpx.get(f"{server.management_url}/models/{model}", timeout=30).json()[0]
    return ran_ids(log) == ["second"] and described["workers"][0]["state"] != "BUSY"


def test_a_stream_answers_in_the_order_its_requests_came(
    server: LiveServer, tmp_path: Path
) -> None:
    log, gate = tmp_path / "ran", tmp_path / "gate"
    answers: list[tuple[Any, Any]] = []
    client = triton_grpc.InferenceServerClient(
        f"127.0.0.1:{server.server.state.ports.grpc_inference}"
    )
    client.start_stream(callback=lambda result, error: answers.append((result, error)))
    try:
        held = {"id": "first", "log": str(log), "gate": str(gate)}
        client.async_stream_infer("held", _text(held), request_id="first")
        until(lambda: ran_ids(log) == ["first"], "the first request runs, held at its gate")
        quick = {"id": "second", "log": str(tmp_path / "quick-ran")}
        client.async_stream_infer("quick", _text(quick), request_id="second")
        client.async_stream_infer("nope", _text(quick), request_id="third")
        quick_ran = tmp_path / "quick-ran"
        until(lambda: _ran_and_idle(server, "quick", quick_ran), "the second request is answered")
        gate.touch()
    finally:
        client.stop_stream()  # returns once every answer has arrived
        client.close()
    assert len(answers) == 3
    (first, no_error), (second, none_either), (missing, error) = answers
    assert no_error is None and first.get_response().id == "first"
    assert none_either is None and second.get_response().id == "second"
    assert missing is None and "nope" in error.message()
