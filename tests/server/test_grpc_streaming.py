"""TorchServe's StreamPredictions over gRPC with a handler that streams
(tests/server/assets/stream_handler.py): parts reach the client while the handler is still
running, and a client that cancels mid-stream stops the handler and frees the worker."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from .conftest import stream_server
from .test_grpc import ts  # noqa: F401  (the fixture: stubs generated from TorchServe's protos)

DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    with stream_server(tmp_path_factory, "grpc-stream") as live:
        channel = grpc.insecure_channel(f"127.0.0.1:{live.server.state.ports.grpc_inference}")
        try:
            yield SimpleNamespace(live=live, channel=channel)
        finally:
            channel.close()


def _stream(server: SimpleNamespace, ts: SimpleNamespace, body: dict):  # noqa: F811
    stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(server.channel)
    request = ts.inference_pb2.PredictionsRequest(
        model_name="stream", input={"data": json.dumps(body).encode()}
    )
    return stub.StreamPredictions(request, timeout=DEADLINE_S)


def _wait_for(path: Path) -> str:
    end = time.monotonic() + DEADLINE_S
    while not path.exists():
        assert time.monotonic() < end, f"{path.name} never appeared"
        time.sleep(0.02)
    return path.read_text()


def test_parts_arrive_before_the_handler_returns(server, ts, tmp_path: Path) -> None:  # noqa: F811
    gate = tmp_path / "gate"
    call = _stream(server, ts, {"parts": ["a", "b"], "gate": str(gate)})
    first = next(call)  # the handler now waits for the gate: this part came while it ran
    assert first.prediction == b"a"
    gate.touch()
    assert [m.prediction for m in call] == [b"b", b"end"]


def test_a_cancelled_stream_stops_the_handler_and_frees_the_worker(
    server,
    ts,  # noqa: F811
    tmp_path: Path,
) -> None:
    gate, stopped = tmp_path / "gate", tmp_path / "stopped"
    call = _stream(server, ts, {"until_stopped": str(stopped), "gate": str(gate)})
    assert next(call).prediction == b"p0"
    call.cancel()
    gate.touch()
    assert _wait_for(stopped) == "StreamCancelled"
    # The one worker serves the next request.
    again = list(_stream(server, ts, {"parts": ["x"]}))
    assert [m.prediction for m in again] == [b"x", b"end"]
