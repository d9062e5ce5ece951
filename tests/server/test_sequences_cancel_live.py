"""Cancellation inside an open sequence on a live server (serving/sequence_ends.py ``cancel``),
as Triton's sequence batcher does it (docs/user_guide/request_cancellation.md: "If a request is
cancelled when using sequence_batching, then all the pending requests in the same sequence will
also be cancelled"; qa/L0_request_cancellation/scheduler_test.py): a queued request of a sequence
started with ``sequence_start`` whose client leaves (an HTTP client that closes its connection,
a gRPC call cancelled) ends the sequence. The request queued behind it is answered cancelled
(HTTP 400, gRPC CANCELLED), neither ever runs, the running one answers, and the id needs a start
again. The gate handler (assets/gate_handler.py) logs every request it runs and holds a batch
until its gate file exists: "running" and "queued" are proven by construction."""

from __future__ import annotations

import json
import queue
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from .cancel_helpers import hang_up, http_request, leaving_with, post, queue_length
from .conftest import LiveServer, gate_server, oip_client, ran_ids, until

pytestmark = pytest.mark.slow

SEQ = {"sequenceBatching": True, "maxNumSequence": 4, "maxSequenceJobQueueSize": 4}
MODELS = {"gseq": {"1.0": {"marName": "gseq.mar", "batchSize": 1, "maxWorkers": 1, **SEQ}}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with gate_server(tmp_path_factory, "seq-cancel-store", MODELS) as live:
        yield live


def _text(body: dict[str, Any]) -> list[triton_grpc.InferInput]:
    text = triton_grpc.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([json.dumps(body).encode()], dtype=object))
    return [text]


def _ended(server: LiveServer) -> int:
    mgmt = httpx.get(f"{server.management_url}/models/gseq", timeout=30).json()
    return mgmt[0]["sequencesEnded"].get("cancelled", 0)


def _leaving(server: LiveServer, client: Any, protocol: str, body: dict, sid: str) -> Callable:
    """A queued request of ``sid`` whose client will leave: the callable that leaves."""
    if protocol == "http":
        sock = leaving_with(server, *http_request("oip", "gseq", body, {"sequence_id": sid}))
        return lambda: hang_up(sock)
    call = client.async_infer("gseq", _text(body), lambda **_: None, sequence_id=sid)
    return call.cancel


def _put_error(errors: queue.Queue, result: Any, error: Any) -> None:
    errors.put(error)


def _behind(pool: Executor, server: LiveServer, client: Any, protocol: str, body: dict, sid: str):
    """A queued request of ``sid`` whose client waits: the callable that returns its error
    (the HTTP status and text; the gRPC status and message)."""
    if protocol == "http":
        answer = pool.submit(post, server, "oip", "gseq", body, {"sequence_id": sid})
        return lambda: (answer.result(timeout=60).status_code, answer.result().text)
    errors: queue.Queue[InferenceServerException | None] = queue.Queue()
    client.async_infer("gseq", _text(body), partial(_put_error, errors), sequence_id=sid)

    def error() -> tuple[str, str]:
        e = errors.get(timeout=60)
        assert e is not None, "answered"
        return e.status(), e.message()

    return error


@pytest.mark.parametrize(("protocol", "status"), [("http", 400), ("grpc", "StatusCode.CANCELLED")])
def test_a_request_cancelled_in_a_sequence_cancels_the_sequence_as_triton_does(
    server: LiveServer, tmp_path: Path, protocol: str, status: object
) -> None:
    """Was: the cancelled request was dropped and the sequence went on (the one behind ran)."""
    sid, log, gate = f"cancelled-{protocol}", tmp_path / "ran", tmp_path / "gate"
    start, body = {"sequence_id": sid, "sequence_start": True}, {"log": str(log)}
    ended = _ended(server)
    with ThreadPoolExecutor(2) as pool, oip_client(server, "grpc") as client:
        first = {**body, "id": "held", "gate": str(gate)}
        held = pool.submit(post, server, "oip", "gseq", first, start)
        until(lambda: ran_ids(log) == ["held"], "the sequence's first request runs")
        leave = _leaving(server, client, protocol, {**body, "id": "left"}, sid)
        until(lambda: queue_length(server, "gseq") == 1, "the second request waits")
        behind = _behind(pool, server, client, protocol, {**body, "id": "behind"}, sid)
        until(lambda: queue_length(server, "gseq") == 2, "the third request waits behind it")
        leave()
        got, text = behind()
        assert got == status and "cancelled" in text, text
        gate.touch()
        assert held.result(timeout=60).status_code == 200
    later = post(server, "oip", "gseq", {**body, "id": "later"}, {"sequence_id": sid})
    assert later.status_code == 400 and "cancelled" in later.json()["error"], later.text
    again = post(server, "oip", "gseq", {**body, "id": "again"}, {**start, "sequence_end": True})
    assert again.status_code == 200, again.text
    assert ran_ids(log) == ["held", "again"]  # neither the cancelled nor the one behind ran
    assert _ended(server) == ended + 1
