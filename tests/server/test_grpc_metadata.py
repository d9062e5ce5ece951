"""What a gRPC call's metadata does to its request, against a real server: tritonclient.grpc and
stubs generated from TorchServe's .proto files.

A call's metadata reaches the handler as request headers (its sequence and schedule headers too,
``x-torchbay-priority``), but not the HTTP headers that say how an HTTP body travels or how its
answer is encoded (``accept-encoding``, ``content-encoding``, ...): a call's message is no HTTP
body and its answer a protobuf message, and Triton's gRPC endpoint reads none of them (gRPC
compresses with its own ``grpc-encoding``).

``sub`` (TorchScript ``a - b``, the tensor handler) and ``headers`` (a function handler that
answers the request headers it was given, as JSON; it fails a request whose text is ``fail``)."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import grpc
import numpy as np
import pytest
import torch
import tritonclient.grpc as triton

from torchbay.archiver.package import ArchiveOptions, package

from .conftest import LiveServer, oip_client, running
from .test_oip import A, B, Sub, sub_inputs

HEADERS = """
import json

def handle(data, context):
    if data is None:
        return None
    if any(row.get("body") == b"fail" for row in data):  # an OIP request whose text is fail
        raise RuntimeError("the model failed")
    return [json.dumps(context.get_all_request_header(i)) for i in range(len(data))]
"""
SUB = {
    "inputs": [
        {"name": "a", "datatype": "FP32", "shape": [-1, 3]},
        {"name": "b", "datatype": "FP32", "shape": [-1, 3]},
    ],
    "outputs": [{"name": "diff", "datatype": "FP32", "shape": [-1, 3]}],
}
# HTTP headers of a body and its answer's encoding, as a client may put them in a call's metadata.
HTTP_BODY = [
    {"accept-encoding": "gzip"},
    {"accept-encoding": "deflate"},
    {"content-encoding": "gzip"},
    {"content-encoding": "br"},
    {"content-length": "3"},
    {"transfer-encoding": "chunked"},
    {"inference-header-content-length": "3"},
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("grpc-metadata-store")
    work = tmp_path_factory.mktemp("grpc-metadata-build")
    (work / "sub.yaml").write_text(json.dumps(SUB))  # JSON is YAML
    torch.jit.save(torch.jit.script(Sub().eval()), str(work / "sub.pt"))
    (work / "headers.py").write_text(HEADERS)
    sub = {
        "handler": "tensor",
        "serialized_file": work / "sub.pt",
        "config_file": work / "sub.yaml",
    }
    for name, options in (("sub", sub), ("headers", {"handler": str(work / "headers.py")})):
        package(ArchiveOptions(model_name=name, version="1", export_path=root, **options))
    with running(root, load_models=["all"]) as live:
        yield live


@pytest.fixture
def client(server: LiveServer) -> Iterator[triton.InferenceServerClient]:
    with oip_client(server, "grpc") as c:
        yield c


def _seen(server: LiveServer, ts: SimpleNamespace, metadata: dict[str, str]) -> dict[str, str]:
    """The request headers the ``headers`` model's handler saw for a Predictions call."""
    port = server.server.state.ports.grpc_inference
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
        request = ts.inference_pb2.PredictionsRequest(model_name="headers", input={"data": b"x"})
        reply = stub.Predictions(request, metadata=tuple(metadata.items()), timeout=60)
    return json.loads(reply.prediction)


@pytest.mark.parametrize("metadata", HTTP_BODY, ids=lambda m: "-".join(*m.items()))
def test_http_body_headers_in_metadata_leave_model_infer_alone(client, metadata) -> None:
    """Were INTERNAL "malformed" (the worker gzipped the OIP answer ModelInfer then parses), or
    a 400/415 for a body never compressed; Triton's gRPC endpoint ignores them."""
    result = client.infer("sub", sub_inputs(triton), headers=metadata)
    np.testing.assert_array_equal(result.as_numpy("diff"), A - B)


def test_http_body_headers_in_metadata_leave_model_stream_infer_alone(client) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    metadata = {"accept-encoding": "gzip", "content-encoding": "gzip"}
    put = lambda result, error: answers.put((result, error))  # noqa: E731
    client.start_stream(callback=put, headers=metadata)
    try:
        client.async_stream_infer("sub", sub_inputs(triton), request_id="s1")
        result, error = answers.get(timeout=120)
    finally:
        client.stop_stream()
    assert error is None, error
    np.testing.assert_array_equal(result.as_numpy("diff"), A - B)


def test_predictions_take_metadata_as_headers_but_not_http_body_ones(server, ts_stubs) -> None:
    """The handler gets the call's own metadata, and not a body's coding it would act on: a
    ``content-encoding`` had the worker inflate a body never compressed (400)."""
    metadata: dict[str, str] = {"x-tenant": "blue"}
    for extra in HTTP_BODY:
        metadata.update(extra)
    seen = _seen(server, ts_stubs, metadata)
    assert seen["x-tenant"] == "blue"
    assert not {name for extra in HTTP_BODY for name in extra} & set(seen), seen
    assert seen["content-type"].startswith("multipart/form-data; boundary=")


def test_metadata_named_like_a_transport_header_reaches_the_handler(server, ts_stubs) -> None:
    """Names that begin as a transport header does (``te``, ``authorization``, ...) are the
    call's own: they were left out as if they were one (``tenant`` as ``te``)."""
    metadata = {
        "tenant": "blue",
        "team": "red",
        "authorization-scope": "read",
        "content-type-hint": "csv",
        "accept-encoding-hint": "none",
    }
    seen = _seen(server, ts_stubs, metadata)
    assert {k: seen.get(k) for k in metadata} == metadata


def _text(text: bytes) -> list[triton.InferInput]:
    tensor = triton.InferInput("text", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([text], dtype=np.object_))
    return [tensor]


def _stream(client, metadata: dict[str, str], texts: list[bytes]) -> list[tuple[Any, Any]]:
    """``(result, error)`` of each answer of one ModelStreamInfer stream of requests to
    ``headers`` (each request's id is its text), in order, once the stream has ended
    (tritonclient's stop_stream waits for that)."""
    answers: list[tuple[Any, Any]] = []
    put = lambda result, error: answers.append((result, error))  # noqa: E731
    client.start_stream(callback=put, headers=metadata)
    try:
        for text in texts:
            client.async_stream_infer("headers", _text(text), request_id=text.decode())
    finally:
        client.stop_stream()
    return answers


def test_triton_grpc_error_ends_the_stream_with_the_first_error(client) -> None:
    """Triton's ``triton_grpc_error: true`` stream metadata: the first error is the stream's
    status (tritonclient gives it its code) and the stream ends; the answers before it come,
    none after. Was ignored: the error came in the stream (no code) and the stream went on."""
    texts = [b"s0", b"fail", b"s2"]
    answers = _stream(client, {"triton_grpc_error": "true"}, texts)
    assert len(answers) == 2, answers
    (first, none), (gone, error) = answers
    assert none is None and first.get_response().id == "s0"
    assert gone is None and error.status() == "StatusCode.INTERNAL", error
    plain = _stream(client, {}, texts)  # without it: each request answered, in order
    assert [r.get_response().id if r else e.status() for r, e in plain] == ["s0", None, "s2"]
