"""The gRPC transport against a real server: message size limits, and client streams when the
server stops. Clients generated at test time from TorchServe's own .proto files, and grpc's
generic stubs over the shipped protos."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import httpx
import pytest

from torchbay.server.grpc import messages

from .conftest import LiveServer, batch_running, build_store, make_config, until
from .test_grpc import (
    HANDLER,
    ts,  # noqa: F401  (the fixture: stubs generated from TorchServe's protos)
)

MAX_RESPONSE = 100_000
GRACE_S = 30.0
DEADLINE_S = 60.0
STREAM_REQUEST, STREAM_RESPONSE, *_ = messages.method_types(
    messages.OIP_SERVICE, "ModelStreamInfer"
)
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


def _held_open(requests: list, sent: threading.Event, release: threading.Event) -> Iterator:
    """A client stream: ``requests``, then held open (as tritonclient holds its stream) until
    ``release``."""
    yield from requests
    sent.set()
    release.wait(DEADLINE_S)


def _read(responses: Any, into: list) -> None:
    """Every message of a stream, then how it ended: ``("end", code, details)``."""
    try:
        for response in responses:
            into.append(response)
        into.append(("end", grpc.StatusCode.OK, ""))
    except grpc.RpcError as exc:
        into.append(("end", exc.code(), exc.details()))


def test_streams_held_open_do_not_hold_the_stop_for_the_grace(store: Path, ts) -> None:  # noqa: F811
    """Streams that their clients keep open between requests end once what they sent is
    answered, UNAVAILABLE: the stop no longer waits out the whole grace for them (it did, then
    grpc cancelled them). A request still running when the stop begins is answered first."""
    live = LiveServer(make_config(store, models=ECHO, shutdown_grace_s=GRACE_S)).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{live.server.state.ports.grpc_inference}")
    oip = channel.stream_stream(
        f"/{messages.OIP_SERVICE}/ModelStreamInfer",
        request_serializer=STREAM_REQUEST.SerializeToString,
        response_deserializer=STREAM_RESPONSE.FromString,
    )
    predict = ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel).StreamPredictions2
    running = ts.inference_pb2.PredictionsRequest(
        model_name="echo", input={"data": b'{"sleep": 1.5, "echo": "last"}'}, sequence_id="s"
    )
    release, streams, threads = threading.Event(), [], []
    for call, requests in ((oip, [_oip_request()]), (predict, [running])):
        sent, answers = threading.Event(), []
        responses = call(_held_open(requests, sent, release), timeout=DEADLINE_S)
        threads.append(threading.Thread(target=_read, args=(responses, answers)))
        threads[-1].start()
        assert sent.wait(DEADLINE_S)
        streams.append(answers)
    until(lambda: batch_running(live, "echo"), "the held stream's request runs")
    started = time.monotonic()
    try:
        live.stop()
        took = time.monotonic() - started
    finally:
        release.set()
        for thread in threads:
            thread.join(DEADLINE_S)
        channel.close()
    assert took < GRACE_S / 2, f"the stop took {took:.1f} s"
    (oip_answer, oip_end), (ts_answer, ts_end) = streams
    assert not oip_answer.error_message and oip_answer.infer_response.id == "held"
    assert json.loads(ts_answer.prediction)["echo"] == "last"
    for end in (oip_end, ts_end):
        assert end[:2] == ("end", grpc.StatusCode.UNAVAILABLE)
        assert "shutting down" in end[2]


def _oip_request() -> Any:
    request = STREAM_REQUEST(model_name="echo", id="held")
    tensor = request.inputs.add(name="data", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(b'{"echo": "held"}')
    return request


# -- a metadata value that is not UTF-8 (grpc's clients refuse to send one: raw HTTP/2) ----------


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    head = len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big")
    return head + payload


def _literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal header field, not indexed, new name, no Huffman (lengths < 127)."""
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def _raw_call(port: int, path: str, message: bytes, extra: list[tuple[bytes, bytes]]) -> bool:
    """One unary gRPC call over a bare HTTP/2 connection; whether the server ended the stream
    with its trailers (a HEADERS frame with END_STREAM) after a DATA frame (the answer)."""
    head = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", path.encode()),
        (b":authority", b"localhost"),
        (b"te", b"trailers"),
        (b"content-type", b"application/grpc"),
        *extra,
    ]
    block = b"".join(_literal(name, value) for name, value in head)
    body = b"\x00" + len(message).to_bytes(4, "big") + message
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as sock:
        preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0, b"")
        sock.sendall(preface + _frame(1, 4, 1, block) + _frame(0, 1, 1, body))
        answered, data = False, b""
        while True:
            while len(data) < 9 or len(data) < 9 + int.from_bytes(data[:3], "big"):
                chunk = sock.recv(65536)
                if not chunk:
                    return False
                data += chunk
            size, kind, flags = int.from_bytes(data[:3], "big"), data[3], data[4]
            stream, data = int.from_bytes(data[5:9], "big") & 0x7FFFFFFF, data[9 + size :]
            if kind == 4 and not flags & 1:
                sock.sendall(_frame(4, 1, 0, b""))  # SETTINGS ACK
            elif stream == 1 and kind == 0:
                answered = True
            elif stream == 1 and kind == 1 and flags & 1:
                return answered
            elif kind in (3, 7):  # RST_STREAM, GOAWAY
                return False


def test_a_metadata_value_that_is_not_utf8_is_no_error_in_the_log(
    server,
    ts,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """grpc logged each read of such a value as an ERROR with a traceback (twice per call: the
    key check and the request's headers); the call is answered, the value read as Latin-1."""
    request = ts.inference_pb2.PredictionsRequest(model_name="echo", input={"data": b'{"echo": 1}'})
    path = f"/{messages.TS_INFERENCE_SERVICE}/Predictions"
    port = server.live.server.state.ports.grpc_inference
    with caplog.at_level(logging.INFO, logger="grpc"):
        assert _raw_call(port, path, request.SerializeToString(), [(b"x-note", b"caf\xe9")])
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


# -- grpc's health checking protocol ---------------------------------------------------------------


def test_grpc_health_check_answers_what_server_ready_answers(server) -> None:
    """grpc.health.v1.Health/Check, as Triton serves it (Kubernetes' gRPC probes ask it): it was
    UNIMPLEMENTED. SERVING while ServerReady is true, NOT_SERVING while it is not (a model held
    at zero workers); an unknown service is NOT_FOUND; Watch is not served."""
    request, response, *_ = messages.method_types(messages.HEALTH_SERVICE, "Check")
    check = server.channel.unary_unary(
        f"/{messages.HEALTH_SERVICE}/Check",
        request_serializer=request.SerializeToString,
        response_deserializer=response.FromString,
    )
    for name in ("", messages.OIP_SERVICE, messages.TS_INFERENCE_SERVICE):
        assert check(request(service=name), timeout=30).status == response.SERVING
    with pytest.raises(grpc.RpcError) as info:
        check(request(service="no.Such"), timeout=30)
    assert info.value.code() is grpc.StatusCode.NOT_FOUND
    watch = server.channel.unary_stream(
        f"/{messages.HEALTH_SERVICE}/Watch", request_serializer=request.SerializeToString
    )
    with pytest.raises(grpc.RpcError) as info:
        list(watch(request(), timeout=30))
    assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED
    scale = f"{server.live.management_url}/models/echo?synchronous=true&min_worker="
    assert httpx.put(scale + "0", timeout=60).status_code == 200
    try:
        assert check(request(), timeout=30).status == response.NOT_SERVING
    finally:
        assert httpx.put(scale + "1", timeout=120).status_code == 200
    assert check(request(), timeout=30).status == response.SERVING


# -- a management call whose client leaves ---------------------------------------------------------


def test_an_unregister_whose_deadline_passes_still_unregisters(store: Path, ts) -> None:  # noqa: F811
    """The operation runs to its end, as over REST. Before, the deadline cancelled it while the
    version drained: the version stayed registered and described READY, refusing every request
    503 'is stopping' until unregistered again."""
    live = LiveServer(make_config(store, models=ECHO, enable_model_api=True)).start()
    ports = live.server.state.ports
    inference = grpc.insecure_channel(f"127.0.0.1:{ports.grpc_inference}")
    management = grpc.insecure_channel(f"127.0.0.1:{ports.grpc_management}")
    try:
        slow = ts.inference_pb2.PredictionsRequest(
            model_name="echo", input={"data": b'{"sleep": 2, "echo": "slow"}'}
        )
        answer = ts.inference_pb2_grpc.InferenceAPIsServiceStub(inference).Predictions.future(
            slow, timeout=DEADLINE_S
        )
        until(lambda: batch_running(live, "echo"), "the slow request runs")
        unregister = ts.management_pb2_grpc.ManagementAPIsServiceStub(management).UnregisterModel
        with pytest.raises(grpc.RpcError) as info:
            unregister(ts.management_pb2.UnregisterModelRequest(model_name="echo"), timeout=0.3)
        assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert json.loads(answer.result().prediction)["echo"] == "slow"  # drained, answered
        described = f"{live.management_url}/models/echo"
        until(lambda: httpx.get(described, timeout=30).status_code == 404, "echo unregistered")
    finally:
        inference.close()
        management.close()
        live.stop()


# -- a unary call without its request message --------------------------------------------------


@pytest.mark.parametrize(
    ("service", "rpc", "listener"),
    [
        (messages.OIP_SERVICE, "ModelInfer", "grpc_inference"),
        (messages.OIP_SERVICE, "ServerLive", "grpc_inference"),
        (messages.TS_INFERENCE_SERVICE, "Predictions", "grpc_inference"),
        (messages.TS_INFERENCE_SERVICE, "StreamPredictions", "grpc_inference"),
        (messages.HEALTH_SERVICE, "Check", "grpc_inference"),
        (messages.TS_MANAGEMENT_SERVICE, "ListModels", "grpc_management"),
    ],
)
def test_a_unary_request_without_its_message_is_answered(server, service, rpc, listener) -> None:
    """A client that half-closes a unary-request call without sending its message (grpc's
    stream_unary over the method's path) is answered UNIMPLEMENTED at once, as grpc's own
    synchronous server answers it; grpc.aio never answered it: the call hung until its deadline
    (for ever without one). The server serves on."""
    port = getattr(server.live.server.state.ports, listener)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        path = f"/{service}/{rpc}"
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            if "Stream" in rpc:
                list(channel.stream_stream(path)(iter(()), timeout=DEADLINE_S))
            else:
                channel.stream_unary(path)(iter(()), timeout=DEADLINE_S)
        assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED, info.value
        assert info.value.details() == f'"{path}" requires exactly one request message.'
        assert time.monotonic() - started < DEADLINE_S / 2
    live, *_ = messages.method_types(messages.OIP_SERVICE, "ServerLive")
    call = server.channel.unary_unary(f"/{messages.OIP_SERVICE}/ServerLive")
    assert call(live().SerializeToString(), timeout=30)  # the server serves on
