"""A client that stops reading a stream while its handler keeps writing
(assets/stream_handler.py's ``until_stopped``: a 50 kB part every 5 ms, ~10 MB/s). The parts
waiting for the client may hold at most ``max_response_size`` bytes (200 kB here): past that
the stream ends with a SlowReader answer and the handler is told to stop, over HTTP (chunked),
gRPC ModelStreamInfer and TorchServe's gRPC StreamPredictions. A stream the server gathers
into one answer (``/generate``, an HTTP/1.0 client's) is bounded as a whole response is: a 500
past ``max_response_size``. Before, all of these were held in the server's memory without
bound for as long as the handler ran."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from .conftest import ASSETS, LiveServer, build_store, make_config
from .test_grpc import ts  # noqa: F401  (the fixture: stubs generated from TorchServe's protos)

pytestmark = pytest.mark.slow
DEADLINE_S = 60.0
# No BDP probing: the client's HTTP/2 window stays at its 64 kB default, so a client that does
# not read holds the server's writes back at once.
_SMALL_WINDOW = [("grpc.http2.bdp_probe", 0)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    store = build_store(tmp_path_factory, "slow", {"stream": str(ASSETS / "stream_handler.py")})
    live = LiveServer(make_config(store, load_models=["stream.mar"], max_response_size=200_000))
    live.start()
    try:
        yield live
    finally:
        live.stop()


def _poll(path: Path) -> str:
    end = time.monotonic() + DEADLINE_S / 2
    while not path.exists():
        assert time.monotonic() < end, f"{path.name} never appeared: the handler was not stopped"
        time.sleep(0.02)
    return path.read_text()


def _body(stopped: Path) -> bytes:
    return json.dumps({"until_stopped": str(stopped), "size": 50_000}).encode()


def _still_serves(server: LiveServer) -> None:
    answer = httpx.post(f"{server.url}/predictions/stream", json={"x": 1}, timeout=DEADLINE_S)
    assert answer.status_code == 200 and answer.json() == {"plain": True}


def test_http(server: LiveServer, tmp_path: Path) -> None:
    stopped = tmp_path / "stopped"
    data = _body(stopped)
    head = f"POST /predictions/stream HTTP/1.1\r\nhost: x\r\ncontent-length: {len(data)}\r\n"
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel holds little
    sock.settimeout(DEADLINE_S)
    with sock:
        sock.connect(("127.0.0.1", server.server.state.ports.inference))
        sock.sendall(head.encode() + b"content-type: application/json\r\n\r\n" + data)
        assert _poll(stopped) == "StreamCancelled"  # while nothing was read
        received = b""
        while not received.endswith(b"\r\n0\r\n\r\n"):
            chunk = sock.recv(1 << 20)
            assert chunk, "the connection closed before the stream's end"
            received += chunk
    assert received.startswith(b"HTTP/1.1 200")  # the first part decided the status
    error = json.loads(received[received.rindex(b'{"code"') :].split(b"\r\n")[0])
    assert error["code"] == 503 and error["type"] == "SlowReader"
    assert "read the stream too slowly" in error["message"]
    _still_serves(server)


def test_grpc_model_stream_infer(server: LiveServer, tmp_path: Path) -> None:
    stopped = tmp_path / "stopped"
    request = service_pb2.ModelInferRequest(model_name="stream", id="slow")
    request.inputs.add(name="INPUT0", datatype="BYTES", shape=[1])
    data = _body(stopped)
    request.raw_input_contents.append(len(data).to_bytes(4, "little") + data)
    done = threading.Event()  # the request stream stays open until the test has read

    def requests() -> Iterator[service_pb2.ModelInferRequest]:
        yield request
        done.wait(DEADLINE_S)

    address = f"127.0.0.1:{server.server.state.ports.grpc_inference}"
    with grpc.insecure_channel(address, options=_SMALL_WINDOW) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        call = stub.ModelStreamInfer(requests(), timeout=DEADLINE_S)
        first = next(call)
        assert not first.error_message  # a part: the stream is under way
        assert _poll(stopped) == "StreamCancelled"  # while nothing more was read
        done.set()
        errors = [r.error_message for r in call if r.error_message]
    assert len(errors) == 1 and "read the stream too slowly" in errors[0]
    _still_serves(server)


def test_grpc_stream_predictions(server: LiveServer, ts, tmp_path: Path) -> None:  # noqa: F811
    stopped = tmp_path / "stopped"
    address = f"127.0.0.1:{server.server.state.ports.grpc_inference}"
    with grpc.insecure_channel(address, options=_SMALL_WINDOW) as channel:
        stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
        request = ts.inference_pb2.PredictionsRequest(
            model_name="stream", input={"data": _body(stopped)}
        )
        call = stub.StreamPredictions(request, timeout=DEADLINE_S)
        assert next(call).prediction.startswith(b"x")
        assert _poll(stopped) == "StreamCancelled"  # while nothing more was read
        with pytest.raises(grpc.RpcError) as ended:
            for _ in call:
                pass
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "read the stream too slowly" in ended.value.details()
    _still_serves(server)


def test_generate_gathers_at_most_max_response_size(server: LiveServer, tmp_path: Path) -> None:
    """``/generate`` joins every part into one answer: bounded as a whole response is."""
    stopped = tmp_path / "stopped"
    answer = httpx.post(
        f"{server.url}/v2/models/stream/generate", content=_body(stopped), timeout=DEADLINE_S
    )
    assert answer.status_code == 500
    assert "exceeds the server's max_response_size of 200000 bytes" in answer.json()["error"]
    assert _poll(stopped) == "StreamCancelled"
    _still_serves(server)


def test_an_http10_stream_is_gathered_at_most_max_response_size(
    server: LiveServer, tmp_path: Path
) -> None:
    """An HTTP/1.0 client gets the stream whole, with its length: bounded the same way."""
    stopped = tmp_path / "stopped"
    data = _body(stopped)
    head = f"POST /predictions/stream HTTP/1.0\r\ncontent-length: {len(data)}\r\n"
    with socket.create_connection(("127.0.0.1", server.server.state.ports.inference)) as sock:
        sock.settimeout(DEADLINE_S)
        sock.sendall(head.encode() + b"content-type: application/json\r\n\r\n" + data)
        received = b""
        while chunk := sock.recv(1 << 20):  # HTTP/1.0: the server closes after the answer
            received += chunk
    assert received.startswith(b"HTTP/1.1 500")
    error = json.loads(received.split(b"\r\n\r\n", 1)[1])
    assert "exceeds the server's max_response_size of 200000 bytes" in error["message"]
    assert _poll(stopped) == "StreamCancelled"
    _still_serves(server)
