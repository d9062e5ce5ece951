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

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2, service_pb2_grpc

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


def test_a_flag_that_is_not_a_bool_is_refused_and_recorded(server: LiveServer) -> None:
    """Refused in Triton's words, and counted as the model's failed request, as every other
    refusal inside the exchange is (it was refused before it, and counted nowhere).
    tritonclient will not send it: raw stubs."""

    def failures() -> int:
        stats = httpx.get(f"{server.url}/v2/models/stream/stats", timeout=30).json()
        return stats["model_stats"][0]["inference_stats"]["fail"]["count"]

    def request(flag: Any) -> Any:
        body = json.dumps({"yield": ["a"]}).encode()
        raw = service_pb2.ModelInferRequest(model_name="stream", id="r2")
        raw.inputs.add(name="INPUT0", datatype="BYTES", shape=[1])
        raw.raw_input_contents.append(len(body).to_bytes(4, "little") + body)
        raw.parameters["triton_enable_empty_final_response"].CopyFrom(flag)
        return raw

    before = failures()
    address = f"127.0.0.1:{server.server.state.ports.grpc_inference}"
    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        flags = [service_pb2.InferParameter(string_param="yes")]
        flags.append(service_pb2.InferParameter(bool_param=True))
        got = list(stub.ModelStreamInfer(iter([request(f) for f in flags]), timeout=DEADLINE_S))
    errors = [r.error_message for r in got if r.error_message]
    refusal = "invalid value type for 'triton_enable_empty_final_response' parameter"
    assert errors == [refusal + ", expected bool_param."]
    assert failures() == before + 1
    served = [r.infer_response for r in got if not r.error_message]  # the stream serves on
    assert served and served[-1].parameters["triton_final_response"].bool_param is True
