"""Cancellation on a live server (tests/server/assets/gate_handler.py), for every protocol: a
client that leaves (an HTTP client that closes its connection, a gRPC call cancelled or past its
deadline) while its request is queued has it removed from the queue, never run (the handler logs
every request it runs) and counted; one that leaves while its batch runs has its result dropped,
the rest of the batch answered and the worker kept (same pid, no restart).

"Running" and "queued" are proven by construction: the handler logs a batch's ids when it starts
and then waits for a gate file, which the test creates only after it has seen what it needs
(the log, the model's queue length)."""

from __future__ import annotations

import asyncio
import fcntl
import json
import socket
import struct
import termios
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from torchbay.server.errors import QueueFull
from torchbay.server.grpc import messages
from torchbay.server.http.disconnect import LEFT, client_left, first_answer
from torchbay.server.plane import CLIENT_LEFT, Exchange
from torchbay.server.plane.exchange import Wiring
from torchbay.server.serving.queue import BatchQueue, Pending, clock

from .conftest import LiveServer, gate_server, ran_ids, until

ONE = {"minWorkers": 1, "maxWorkers": 1}
MODELS = {
    "gate": {"1.0": {"marName": "gate.mar", "batchSize": 1, **ONE}},
    # Batches of 2: two requests queued behind a running one leave together.
    "pair": {"1.0": {"marName": "pair.mar", "batchSize": 2, "maxBatchDelay": 100, **ONE}},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with gate_server(tmp_path_factory, "cancel-store", MODELS) as live:
        yield live


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as executor:
        yield executor


# -- the requests, per protocol ---------------------------------------------------------------


def _http_request(
    api: str, model: str, body: dict[str, Any], params: dict[str, Any] | None = None
) -> tuple[str, bytes]:
    """The path and JSON body of ``body`` sent to ``model`` over TorchServe or OIP REST (with
    the request ``parameters`` ``params``, if any: OIP)."""
    if api == "ts":
        return f"/predictions/{model}", json.dumps(body).encode()
    text = {"name": "text", "datatype": "BYTES", "shape": [1], "data": [json.dumps(body)]}
    doc = {"inputs": [text], **({"parameters": params} if params else {})}
    return f"/v2/models/{model}/infer", json.dumps(doc).encode()


def _post(
    server: LiveServer,
    api: str,
    model: str,
    body: dict[str, Any],
    params: dict[str, Any] | None = None,
) -> httpx.Response:
    path, content = _http_request(api, model, body, params)
    headers = {"content-type": "application/json"}
    return httpx.post(server.url + path, content=content, headers=headers, timeout=60)


def _leaving(server: LiveServer, api: str, model: str, body: dict[str, Any]) -> socket.socket:
    """A raw HTTP/1.1 request whose client will leave: the caller closes the socket."""
    return _leaving_with(server, *_http_request(api, model, body))


def _leaving_with(server: LiveServer, path: str, content: bytes) -> socket.socket:
    """``_leaving`` of a request already made (``_http_request``'s path and body)."""
    sock = socket.create_connection(("127.0.0.1", server.server.state.ports.inference))
    sock.sendall(_head(path, len(content)) + content)
    return sock


def _head(path: str, length: int) -> bytes:
    """The request line and headers of a JSON POST of ``length`` bytes to ``path``."""
    return (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"content-length: {length}\r\n\r\n"
    ).encode()


def _leave(sock: socket.socket) -> None:
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def _grpc_call(
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


def _counts(server: LiveServer, model: str) -> dict[str, float]:
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


def _grew(before: dict[str, float], after: dict[str, float], **grown: int) -> bool:
    """``after`` is ``before`` with the counts named in ``grown`` grown by that much."""
    return after == {k: v + grown.get(k, 0) for k, v in before.items()}


def _triton(server: LiveServer, model: str) -> tuple[int, int]:
    """The Triton statistics' ``fail`` and ``queue`` counts of ``model``."""
    stats = httpx.get(f"{server.url}/v2/models/{model}/stats", timeout=30).json()
    inference = stats["model_stats"][0]["inference_stats"]
    return inference["fail"]["count"], inference["queue"]["count"]


def _queued(server: LiveServer, model: str) -> int:
    return len(server.server.registry.resolve(model).queue)


def _run_behind(
    pool: ThreadPoolExecutor, server: LiveServer, model: str, tmp_path: Path
) -> tuple[Future, Path, Path]:
    """A request ("held") running on ``model``'s worker until its gate opens; its answer, the
    handler's log and the gate."""
    log, gate = tmp_path / "ran", tmp_path / "held-gate"
    held = pool.submit(
        _post, server, "ts", model, {"id": "held", "log": str(log), "gate": str(gate)}
    )
    until(lambda: ran_ids(log) == ["held"], "the first request runs")
    return held, log, gate


def _still_served(server: LiveServer, model: str, log: Path, pids: list[int]) -> None:
    """A later request runs on the same worker process (no restart)."""
    answer = _post(server, "ts", model, {"id": "later", "log": str(log)})
    assert answer.status_code == 200, answer.text
    assert answer.json()["pid"] in pids
    assert server.worker_pids() == pids


def _removed_and_counted(
    server: LiveServer, before: dict, queued: int, held: Future, gate: Path, log: Path, pids: list
) -> None:
    """After a client left with ``queued`` requests waiting behind the held one: they are taken
    out and counted (499 once), the held one is answered, and the worker serves on; only the
    held and a later request ever ran."""
    until(lambda: _queued(server, "gate") == 0, "the requests of the client that left are removed")
    until(lambda: _grew(before, _counts(server, "gate"), queued=queued, **{"499": 1}), "counted")
    gate.touch()
    assert held.result(timeout=60).status_code == 200
    _still_served(server, "gate", log, pids)
    assert ran_ids(log) == ["held", "later"]  # the requests that left never ran


# -- queued: removed, never run, counted ------------------------------------------------------


@pytest.mark.parametrize("api", ["ts", "oip"])
def test_an_http_client_that_leaves_while_queued_is_never_run(
    server: LiveServer, pool: ThreadPoolExecutor, tmp_path: Path, api: str
) -> None:
    pids, before, (failed, queued) = (
        server.worker_pids(),
        _counts(server, "gate"),
        _triton(server, "gate"),
    )
    held, log, gate = _run_behind(pool, server, "gate", tmp_path)
    sock = _leaving(server, api, "gate", {"id": "gone", "log": str(log)})
    until(lambda: _queued(server, "gate") == 1, "the second request is queued")
    _leave(sock)
    _removed_and_counted(server, before, 1, held, gate, log, pids)
    # Triton counts a cancelled request as failed; only the two that ran waited for a worker.
    assert _triton(server, "gate") == (failed + 1, queued + 2)


@pytest.mark.parametrize(("api", "leave"), [("oip", "cancel"), ("ts", "deadline")])
def test_a_grpc_call_that_leaves_while_queued_is_never_run(
    server: LiveServer,
    ts_stubs: SimpleNamespace,
    pool: ThreadPoolExecutor,
    tmp_path: Path,
    api: str,
    leave: str,
) -> None:
    pids, before = server.worker_pids(), _counts(server, "gate")
    held, log, gate = _run_behind(pool, server, "gate", tmp_path)
    timeout = 2.0 if leave == "deadline" else 60.0
    call = _grpc_call(server, ts_stubs, api, "gate", {"id": "gone", "log": str(log)}, timeout)
    if leave == "cancel":
        until(lambda: _queued(server, "gate") == 1, "the second request is queued")
        call.cancel()
    else:
        with pytest.raises(grpc.RpcError) as info:
            call.result(timeout=60)
        assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    _removed_and_counted(server, before, 1, held, gate, log, pids)


def test_a_kserve_v1_client_that_leaves_while_queued_has_no_instance_run(
    server: LiveServer, pool: ThreadPoolExecutor, tmp_path: Path
) -> None:
    """Every instance queued for a v1 predict call that left is taken out, none runs; one 499."""
    pids, before = server.worker_pids(), _counts(server, "gate")
    held, log, gate = _run_behind(pool, server, "gate", tmp_path)
    instances = [{"id": f"gone{i}", "log": str(log), "n": i} for i in range(2)]  # JSON rows
    content = json.dumps({"instances": instances}).encode()
    sock = _leaving_with(server, "/v1/models/gate:predict", content)
    until(lambda: _queued(server, "gate") == 2, "both instances are queued")
    _leave(sock)
    _removed_and_counted(server, before, 2, held, gate, log, pids)


def test_a_kserve_v1_client_that_leaves_while_its_body_is_parsed_has_no_instance_run(
    server: LiveServer, pool: ThreadPoolExecutor, tmp_path: Path
) -> None:
    """A large v1 body is parsed in steps, the loop serving others meanwhile: a client that
    leaves then is noticed, and none of its instances runs; one 499. (Was: the leave went
    unnoticed, every instance was queued and ran for nobody, and the call was recorded 200.)"""
    pids, before = server.worker_pids(), _counts(server, "gate")
    held, log, gate = _run_behind(pool, server, "gate", tmp_path)
    pad = b",".join([b"[]"] * 1_000_000)  # 3 MB of small lists per instance: a long parse
    path = json.dumps(str(log)).encode()
    rows = [b'{"id": "gone%d", "log": %s, "pad": [%s]}' % (i, path, pad) for i in range(2)]
    content = b'{"instances": [' + b",".join(rows) + b"]}"
    # All but its last bytes, read; then those (a read that small leaves the connection read
    # on, so its close is seen), read too, the parse begun: then the client leaves.
    sock = socket.create_connection(("127.0.0.1", server.server.state.ports.inference))
    head = _head("/v1/models/gate:predict", len(content))
    for part in (head + content[:-2], content[-2:]):
        sock.sendall(part)
        until(lambda: _unsent(sock) == 0, "the body is delivered")
        for _ in range(3):  # turns of the server's loop: what was delivered is read
            assert httpx.get(f"{server.url}/ping", timeout=60).status_code == 200
    _leave(sock)
    until(lambda: _counts(server, "gate")["499"] == before["499"] + 1, "the call is counted 499")
    gate.touch()
    assert held.result(timeout=60).status_code == 200
    _still_served(server, "gate", log, pids)
    assert ran_ids(log) == ["held", "later"]  # no instance of the call that left ever ran


def _unsent(sock: socket.socket) -> int:
    """Bytes of ``sock``'s output the server's side has not acknowledged yet."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]


# -- running: the result dropped, the batch answered, the worker kept -------------------------


def _batch_of_two(
    pool: ThreadPoolExecutor,
    server: LiveServer,
    tmp_path: Path,
    leaver: Callable[[dict[str, Any]], Any],
) -> tuple[Future, Future, Any, Path, Path]:
    """On ``pair``: "stays" (HTTP) and "gone" (``leaver``'s request) queued behind a held
    request, then running together in one batch, blocked on a gate."""
    held, log, first_gate = _run_behind(pool, server, "pair", tmp_path)
    gate = tmp_path / "gate"
    body = {"log": str(log), "gate": str(gate)}
    stays = pool.submit(_post, server, "ts", "pair", {"id": "stays", **body})
    until(lambda: _queued(server, "pair") == 1, "the second request is queued")
    gone = leaver({"id": "gone", **body})
    until(lambda: _queued(server, "pair") == 2, "the third request is queued")
    first_gate.touch()
    until(lambda: ran_ids(log) == ["held", "stays", "gone"], "the batch of two runs")
    assert held.result(timeout=60).status_code == 200
    return stays, held, gone, log, gate


@pytest.mark.parametrize("api", ["ts", "oip"])
def test_an_http_client_that_leaves_while_its_batch_runs(
    server: LiveServer, pool: ThreadPoolExecutor, tmp_path: Path, api: str
) -> None:
    pids, before = server.worker_pids(), _counts(server, "pair")
    stays, _, sock, log, gate = _batch_of_two(
        pool, server, tmp_path, lambda body: _leaving(server, api, "pair", body)
    )
    _leave(sock)
    until(lambda: _grew(before, _counts(server, "pair"), running=1, **{"499": 1}), "counted")
    _open_gate(server, gate, stays, log, pids, before)


@pytest.mark.parametrize("api", ["ts", "oip"])
def test_a_grpc_call_cancelled_while_its_batch_runs(
    server: LiveServer,
    ts_stubs: SimpleNamespace,
    pool: ThreadPoolExecutor,
    tmp_path: Path,
    api: str,
) -> None:
    pids, before = server.worker_pids(), _counts(server, "pair")
    stays, _, call, log, gate = _batch_of_two(
        pool, server, tmp_path, lambda body: _grpc_call(server, ts_stubs, api, "pair", body, 60)
    )
    call.cancel()
    until(lambda: _grew(before, _counts(server, "pair"), running=1, **{"499": 1}), "counted")
    _open_gate(server, gate, stays, log, pids, before)


# -- the parts on their own -------------------------------------------------------------------


def test_a_discarded_request_frees_its_place_at_once_and_never_runs() -> None:
    async def scenario() -> list[object]:
        loop = asyncio.get_running_loop()
        queue: BatchQueue = BatchQueue(batch_size=2, max_delay_s=0, capacity=2)
        gone, here = (Pending(name, loop.create_future(), clock()) for name in ("gone", "here"))
        queue.put(gone)
        queue.put(here)
        with pytest.raises(QueueFull):
            queue.put(Pending("late", loop.create_future(), clock()))
        gone.future.cancel()
        assert queue.discard(gone)
        assert not queue.discard(gone)  # not queued any more
        queue.put(Pending("late", loop.create_future(), clock()))  # its place was freed
        batch = await queue.take()
        assert all(p.dispatched is not None for p in batch)
        queue.requeue_front(batch)  # its worker died before it ran: queued again
        assert all(p.dispatched is None for p in batch)
        return [p.payload for p in await queue.take()]

    assert asyncio.run(scenario()) == ["here", "late"]


def _waiting(scope: dict[str, Any]) -> tuple[Exchange, asyncio.Future, asyncio.Task]:
    """An exchange whose one request waits for its answer through ``first_answer``."""
    ex = Exchange(Wiring(None, lambda record: None), scope, "m", None)  # type: ignore[arg-type]
    future = asyncio.get_running_loop().create_future()
    ex.items.append(Pending(None, future, clock()))
    return ex, future, asyncio.ensure_future(first_answer(scope, ex, future))


def test_a_client_that_left_ends_the_wait_and_a_stopping_server_still_cancels() -> None:
    async def scenario() -> None:
        scope: dict[str, Any] = {}
        ex, future, task = _waiting(scope)
        await asyncio.sleep(0)
        assert scope[LEFT] == ex.leave
        client_left(SimpleNamespace(scope=scope))  # the protocol's connection_lost
        assert await task is None
        assert future.cancelled() and ex.status == CLIENT_LEFT and LEFT not in scope
        client_left(SimpleNamespace(scope=scope))  # answered or gone: nothing to tell
        client_left(None)  # a connection lost between requests

        ex, future, task = _waiting(scope)
        await asyncio.sleep(0)
        task.cancel()  # the task itself (a server that stops), not the client
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ex.status == 500 and LEFT not in scope

    asyncio.run(scenario())


def _open_gate(
    server: LiveServer, gate: Path, stays: Any, log: Path, pids: list, before: dict
) -> None:
    """Let the batch finish: the request that stayed is answered, the same workers serve on
    and none restarted."""
    gate.touch()
    answer = stays.result(timeout=60)
    assert answer.status_code == 200 and answer.json()["id"] == "stays"
    _still_served(server, "pair", log, pids)
    assert _counts(server, "pair")["restarts"] == before["restarts"]
