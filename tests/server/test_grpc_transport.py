"""The gRPC transport against a real server: message size limits, and streams when the server
stops. Clients generated at test time from TorchServe's own .proto files and tritonclient."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import grpc
import httpx
import pytest

from .conftest import LiveServer, build_store, make_config
from .test_grpc import (
    HANDLER,
    ts,  # noqa: F401  (the fixture: stubs generated from TorchServe's protos)
)

MAX_RESPONSE = 100_000
ECHO = {"echo": {"1.0": {"marName": "echo.mar", "defaultVersion": True}}}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory, "grpc-transport", {"echo": HANDLER})


@pytest.fixture(scope="module")
def server(store: Path) -> Iterator[SimpleNamespace]:
    config = make_config(store, models=ECHO, max_response_size=MAX_RESPONSE)
    live = LiveServer(config).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{live.server.state.ports.grpc_inference}")
    try:
        yield SimpleNamespace(live=live, channel=channel)
    finally:
        channel.close()
        live.stop()


def _echo_of(size: int) -> bytes:
    """A request body whose answer by tests/clients/grpc_handler.py is ``size`` bytes."""
    empty = len(json.dumps({"batch": 1, "echo": "", "keys": ["data"]}, separators=(",", ":")))
    return json.dumps({"echo": "x" * (size - empty)}).encode()


def test_an_answer_of_max_response_size_reaches_the_grpc_client(server, ts) -> None:  # noqa: F811
    """The answer's bound is max_response_size, as over REST; the message around it is larger.
    Before, grpc's send limit was max_response_size too: RESOURCE_EXHAUSTED 'Sent message larger
    than max' (and grpc's ERROR traceback in the log) for an answer REST served."""
    stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(server.channel)
    body = _echo_of(MAX_RESPONSE)
    rest = httpx.post(f"{server.live.url}/predictions/echo", content=body, timeout=60)
    assert rest.status_code == 200 and len(rest.content) == MAX_RESPONSE
    request = ts.inference_pb2.PredictionsRequest(model_name="echo", input={"data": body})
    answer = stub.Predictions(request, timeout=60).prediction
    assert len(answer) == MAX_RESPONSE and json.loads(answer)["keys"] == ["data"]
    parts = list(stub.StreamPredictions(request, timeout=60))
    assert [p.prediction for p in parts] == [answer]
    over = ts.inference_pb2.PredictionsRequest(
        model_name="echo", input={"data": _echo_of(MAX_RESPONSE + 1)}
    )
    with pytest.raises(grpc.RpcError) as info:
        stub.Predictions(over, timeout=60)
    assert info.value.code() is grpc.StatusCode.INTERNAL
    assert f"exceeds the server's max_response_size of {MAX_RESPONSE} bytes" in (
        info.value.details()
    )
