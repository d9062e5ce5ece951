"""The Open Inference Protocol's infer endpoints answer once (REST ``/v2/models/{m}/infer``,
gRPC ``ModelInfer``). A handler that streams (assets/stream_handler.py: a generator, each item
one answer) is refused there as Triton refuses a decoupled model: 501 / UNIMPLEMENTED "...
doesn't support models with decoupled transaction policy" (REST wrote the parts back to back
as one body that no OIP client parses, and gRPC kept the last part, dropping the others). A
generator that yields nothing gave REST an empty 200 (tritonclient failed decoding it) and
gRPC an INTERNAL naming a JSON decoder error; now a 500 "The model gave no response", and on
ModelStreamInfer nothing at all (only the final flag when asked for), as Triton answers a
decoupled model that sends no response."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from .conftest import LiveServer, stream_server, until

pytestmark = pytest.mark.slow
DECOUPLED = "doesn't support models with decoupled transaction policy"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with stream_server(tmp_path_factory, "answers-once") as live:
        yield live


def _tensor(module: Any, body: dict[str, Any]) -> list[Any]:
    tensor = module.InferInput("INPUT0", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([json.dumps(body).encode()], dtype=object))
    return [tensor]


def _infer(server: LiveServer, protocol: str, body: dict[str, Any]) -> InferenceServerException:
    ports = server.server.state.ports
    if protocol == "http":
        client: Any = triton_http.InferenceServerClient(f"127.0.0.1:{ports.inference}")
        module: Any = triton_http
    else:
        client = triton_grpc.InferenceServerClient(f"127.0.0.1:{ports.grpc_inference}")
        module = triton_grpc
    try:
        with pytest.raises(InferenceServerException) as refused:
            client.infer("stream", _tensor(module, body))
    finally:
        client.close()
    return refused.value


@pytest.mark.parametrize(
    ("protocol", "status", "endpoint"),
    [("http", "501", "HTTP end point"), ("grpc", "StatusCode.UNIMPLEMENTED", "ModelInfer RPC")],
)
def test_a_handler_that_streams_is_refused_as_a_decoupled_model(
    server: LiveServer, tmp_path: Path, protocol: str, status: str, endpoint: str
) -> None:
    closed = tmp_path / "closed"  # the generator yields until it is closed, then writes here
    refused = _infer(server, protocol, {"yield": ["a", "b"], "closed": str(closed)})
    assert refused.status() == status and f"{endpoint} {DECOUPLED}" in refused.message()
    # The stream was closed (the handler told to stop) and the worker serves on.
    until(closed.exists, "the handler's generator is closed")
    served = httpx.post(f"{server.url}/predictions/stream", json={"x": 1}, timeout=60)
    assert served.status_code == 200 and served.json() == {"plain": True}


@pytest.mark.parametrize(("protocol", "status"), [("http", "500"), ("grpc", "StatusCode.INTERNAL")])
def test_a_handler_that_answers_nothing_gave_no_response(
    server: LiveServer, protocol: str, status: str
) -> None:
    refused = _infer(server, protocol, {"yield": []})
    assert refused.status() == status and refused.message() == "The model gave no response"


def test_a_stream_request_answered_by_nothing_gets_nothing_or_its_final_flag(
    server: LiveServer,
) -> None:
    client = triton_grpc.InferenceServerClient(
        f"127.0.0.1:{server.server.state.ports.grpc_inference}"
    )
    got: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    client.async_stream_infer("stream", _tensor(triton_grpc, {"yield": []}), request_id="none")
    client.async_stream_infer(
        "stream", _tensor(triton_grpc, {"yield": []}), request_id="flag",
        enable_empty_final_response=True,
    )  # fmt: skip
    client.stop_stream()  # returns once every answer has arrived
    client.close()
    (result, error), *more = [got.get_nowait() for _ in range(got.qsize())]
    assert error is None and more == []
    response = result.get_response()
    assert response.id == "flag" and not response.outputs
    assert response.parameters["triton_final_response"].bool_param is True
