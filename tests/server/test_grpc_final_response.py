"""Triton's decoupled final-response flag over gRPC ModelStreamInfer, with tritonclient.grpc's
``enable_empty_final_response`` against a real streaming handler (assets/stream_handler.py):
every response carries ``triton_final_response`` (false on a streamed part), the stream of a
request ends on true (an empty response when the handler ends without a final one, as Triton
answers a decoupled model's bare final flag), and without the flag nothing changes."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton

from .conftest import LiveServer, stream_server

pytestmark = pytest.mark.slow
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with stream_server(tmp_path_factory, "grpc-final") as live:
        yield live


def _stream(server: LiveServer, body: dict, **kwargs: Any) -> list[SimpleNamespace]:
    """One request on a fresh stream: each response's text, parameters and error, in order."""
    client = triton.InferenceServerClient(f"127.0.0.1:{server.server.state.ports.grpc_inference}")
    got: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    tensor = triton.InferInput("INPUT0", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([json.dumps(body).encode()], dtype=object))
    client.async_stream_infer("stream", [tensor], request_id="r1", **kwargs)
    client.stop_stream()  # waits for the server to end the stream: every response is in
    client.close()
    out = []
    while not got.empty():
        result, error = got.get_nowait()
        if error is not None:
            out.append(SimpleNamespace(text=None, params={}, error=str(error), id=None))
            continue
        response = result.get_response()
        params = {
            k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in response.parameters.items()
        }
        data = result.as_numpy(response.outputs[0].name) if response.outputs else None
        text = data.reshape(-1)[0].decode() if data is not None else None
        out.append(SimpleNamespace(text=text, params=params, error=None, id=response.id))
    return out


def test_a_generator_ends_with_an_empty_final_response(server: LiveServer) -> None:
    got = _stream(server, {"yield": ["a", "b"]}, enable_empty_final_response=True)
    assert [(r.text, r.params.get("triton_final_response")) for r in got] == [
        ("a", False),
        ("b", False),
        (None, True),  # the empty final response: no outputs, only the flag
    ]
    assert got[-1].id == "r1"


def test_a_final_response_carries_the_flag_itself(server: LiveServer) -> None:
    got = _stream(server, {"parts": ["a", "b"]}, enable_empty_final_response=True)
    flags = [(r.text, r.params.get("triton_final_response")) for r in got]
    assert flags == [("a", False), ("b", False), ("end", True)]


def test_a_model_that_does_not_stream_answers_once_flagged_final(server: LiveServer) -> None:
    got = _stream(server, {"other": 1}, enable_empty_final_response=True)
    assert len(got) == 1 and got[0].params.get("triton_final_response") is True
    assert json.loads(got[0].text) == {"plain": True}
    assert set(got[0].params) == {"triton_final_response"}


def test_without_the_flag_nothing_changes(server: LiveServer) -> None:
    got = _stream(server, {"yield": ["a", "b"]})
    assert [r.text for r in got] == ["a", "b"]
    assert all("triton_final_response" not in r.params for r in got)


def test_an_error_mid_stream_ends_the_request_without_an_empty_response(
    server: LiveServer,
) -> None:
    got = _stream(server, {"parts": ["a"], "then_raise": True}, enable_empty_final_response=True)
    assert got[0].text == "a" and got[0].params["triton_final_response"] is False
    # The error is the request's last answer (tritonclient hands it over as an error).
    assert len(got) == 2 and got[1].error is not None and "ValueError" in got[1].error
