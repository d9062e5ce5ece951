"""The requests of the cancellation tests (test_cancel.py), per protocol, and what the server
did with them, read from outside: its metrics, its Triton statistics, its queue and the gate
handler's log (tests/server/assets/gate_handler.py)."""

from __future__ import annotations

import fcntl
import json
import socket
import struct
import termios
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import httpx
from prometheus_client.parser import text_string_to_metric_families

from torchbay.server.grpc import messages

from .conftest import LiveServer, ran_ids, until

# -- the requests, per protocol ---------------------------------------------------------------


def http_request(
    api: str, model: str, body: dict[str, Any], params: dict[str, Any] | None = None
) -> tuple[str, bytes]:
    """The path and JSON body of ``body`` sent to ``model`` over TorchServe or OIP REST (with
    the request ``parameters`` ``params``, if any: OIP)."""
    if api == "ts":
        return f"/predictions/{model}", json.dumps(body).encode()
    text = {"name": "text", "datatype": "BYTES", "shape": [1], "data": [json.dumps(body)]}
    doc = {"inputs": [text], **({"parameters": params} if params else {})}
    return f"/v2/models/{model}/infer", json.dumps(doc).encode()


def post(
    server: LiveServer,
    api: str,
    model: str,
    body: dict[str, Any],
    params: dict[str, Any] | None = None,
) -> httpx.Response:
    path, content = http_request(api, model, body, params)
    headers = {"content-type": "application/json"}
    return httpx.post(server.url + path, content=content, headers=headers, timeout=60)


def leaving(server: LiveServer, api: str, model: str, body: dict[str, Any]) -> socket.socket:
    """A raw HTTP/1.1 request whose client will leave: the caller closes the socket."""
    return leaving_with(server, *http_request(api, model, body))


def leaving_with(server: LiveServer, path: str, content: bytes) -> socket.socket:
    """``leaving`` of a request already made (``http_request``'s path and body)."""
    sock = socket.create_connection(("127.0.0.1", server.server.state.ports.inference))
    sock.sendall(request_head(path, len(content)) + content)
    return sock


def request_head(path: str, length: int) -> bytes:
    """The request line and headers of a JSON POST of ``length`` bytes to ``path``."""
    return (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"content-length: {length}\r\n\r\n"
    ).encode()


def hang_up(sock: socket.socket) -> None:
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def grpc_call(
    server: LiveServer,
    ts: SimpleNamespace,
    api: str,
    model: str,
    body: dict[str, Any],
    timeout: float,
) -> grpc.Future:
    """``body`` as TorchServe's Predictions or OIP's ModelInfer (one BYTES input), in flight."""
    channel = grpc.insecure_channel(f"127.0.0.1:{server.server.state.ports.grpc_inference}")
    data = json.dumps(body).encode()
    if api == "ts":
        stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
        request = ts.inference_pb2.PredictionsRequest(model_name=model, input={"data": data})
        return stub.Predictions.future(request, timeout=timeout)
    request_type, response_type, *_ = messages.method_types(messages.OIP_SERVICE, "ModelInfer")
    infer = channel.unary_unary(
        f"/{messages.OIP_SERVICE}/ModelInfer",
        request_serializer=request_type.SerializeToString,
        response_deserializer=response_type.FromString,
    )
    request = request_type(model_name=model)
    request.inputs.add(name="text", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(struct.pack("<I", len(data)) + data)
    return infer.future(request, timeout=timeout)


# -- what the server did ----------------------------------------------------------------------


def cancel_counts(server: LiveServer, model: str) -> dict[str, float]:
    """The model's cancelled requests by stage, and its answers recorded 499 and its worker
    restarts (the metrics port's series)."""
    counts = {"queued": 0.0, "running": 0.0, "499": 0.0, "restarts": 0.0}
    scrape = httpx.get(f"{server.metrics_url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(scrape):
        for s in family.samples:
            if s.labels.get("model") != model or not s.name.endswith("_total"):
                continue
            if family.name == "torchbay_cancelled_requests":
                counts[s.labels["stage"]] = s.value
            elif family.name == "torchbay_requests" and s.labels["code"] == "499":
                counts["499"] = s.value
            elif family.name == "torchbay_worker_restarts":
                counts["restarts"] = s.value
    return counts


def grew(before: dict[str, float], after: dict[str, float], **grown: int) -> bool:
    """``after`` is ``before`` with the counts named in ``grown`` grown by that much."""
    return after == {k: v + grown.get(k, 0) for k, v in before.items()}


def triton_counts(server: LiveServer, model: str) -> tuple[int, int]:
    """The Triton statistics' ``fail`` and ``queue`` counts of ``model``."""
    stats = httpx.get(f"{server.url}/v2/models/{model}/stats", timeout=30).json()
    inference = stats["model_stats"][0]["inference_stats"]
    return inference["fail"]["count"], inference["queue"]["count"]


def queue_length(server: LiveServer, model: str) -> int:
    return len(server.server.registry.resolve(model).queue)


def run_behind(
    pool: ThreadPoolExecutor, server: LiveServer, model: str, tmp_path: Path
) -> tuple[Future, Path, Path]:
    """A request ("held") running on ``model``'s worker until its gate opens; its answer, the
    handler's log and the gate."""
    log, gate = tmp_path / "ran", tmp_path / "held-gate"
    held = pool.submit(
        post, server, "ts", model, {"id": "held", "log": str(log), "gate": str(gate)}
    )
    until(lambda: ran_ids(log) == ["held"], "the first request runs")
    return held, log, gate


def still_served(server: LiveServer, model: str, log: Path, pids: list[int]) -> None:
    """A later request runs on the same worker process (no restart)."""
    answer = post(server, "ts", model, {"id": "later", "log": str(log)})
    assert answer.status_code == 200, answer.text
    assert answer.json()["pid"] in pids
    assert server.worker_pids() == pids


def removed_and_counted(
    server: LiveServer, before: dict, queued: int, held: Future, gate: Path, log: Path, pids: list
) -> None:
    """After a client left with ``queued`` requests waiting behind the held one: they are taken
    out and counted (499 once), the held one is answered, and the worker serves on; only the
    held and a later request ever ran."""
    until(
        lambda: queue_length(server, "gate") == 0,
        "the requests of the client that left are removed",
    )
    until(
        lambda: grew(before, cancel_counts(server, "gate"), queued=queued, **{"499": 1}), "counted"
    )
    gate.touch()
    assert held.result(timeout=60).status_code == 200
    still_served(server, "gate", log, pids)
    assert ran_ids(log) == ["held", "later"]  # the requests that left never ran


def unsent(sock: socket.socket) -> int:
    """Bytes of ``sock``'s output the server's side has not acknowledged yet."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
