"""Sequences on a real server (serving/sequences.py, plane/sequence_params.py): TorchServe's
stateful example (its handler and model-config.yaml unchanged: 2 workers, batch size 4,
``sequenceMaxIdleMSec: 10``) over TorchServe REST and gRPC ``StreamPredictions2``, several
sequences interleaved; and the same handler behind the Open Inference Protocol's sequence
parameters (REST), whose bad values are 400s naming the field.

The handler adds each request's number to its sequence's running total, kept in the worker
(an LRU per worker process), so a request that ran on the wrong worker, out of order or
beside another of its sequence in one batch would answer a wrong total."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import shutil
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from .conftest import ASSETS, batch_running, build_store, oip_client, running, until
from .stateful_store import (
    CORRID_INT32,
    EXAMPLE,
    NUMBERS,
    RECORDS,
    SEQ_HEADER,
    archive,
    interleaved,
    served,
)
from .test_grpc import ts  # noqa: F401  (the fixture: stubs generated from TorchServe's protos)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    root = tmp_path_factory.mktemp("seq-store")
    work = tmp_path_factory.mktemp("seq-build")
    archive(root, work, "stateful", EXAMPLE / "sequence_batching" / "model-config.yaml")
    # The same handler for OIP clients, whose sequences start and end explicitly (Triton).
    oip_config = work / "oip.yaml"
    shutil.copy(EXAMPLE / "sequence_batching" / "model-config.yaml", oip_config)
    with oip_config.open("a") as f:
        f.write("sequenceMaxIdleMSec: 60000\n")
    archive(root, work, "stateful_oip", oip_config)
    # One worker, to be killed: its sequences must end with a clear error.
    dying_config = work / "dying.yaml"
    shutil.copy(oip_config, dying_config)
    with dying_config.open("a") as f:
        f.write("minWorkers: 1\nmaxWorkers: 1\n")
    archive(root, work, "stateful_dying", dying_config)
    # Triton's CORRID control input, a 32-bit one (an id past it is the client's mistake).
    corrid_config = work / "corrid.yaml"
    shutil.copy(dying_config, corrid_config)
    corrid_config.write_text(corrid_config.read_text() + CORRID_INT32)
    archive(root, work, "stateful_corrid", corrid_config)
    yield from served(root)


def _totals() -> list[int]:
    return list(itertools.accumulate(NUMBERS))


def test_torchserve_rest_sequences_interleaved_keep_their_totals(server) -> None:
    def run_one(i: int) -> list:
        answers = []
        with httpx.Client(timeout=60) as client:
            for n in NUMBERS:
                r = client.post(
                    f"{server.url}/predictions/stateful",
                    content=str(n * (i + 1)).encode(),
                    headers={SEQ_HEADER: f"seq_{i}"},
                )
                assert r.status_code == 200, r.text
                assert r.headers[SEQ_HEADER] == f"seq_{i}"  # SageMaker's sticky routing
                answers.append(int(r.text))
        return answers

    results = interleaved(4, run_one)
    for i, answers in results.items():
        assert answers == [t * (i + 1) for t in _totals()], i


def test_a_request_without_an_id_starts_a_sequence_the_server_names(server) -> None:
    first = httpx.post(f"{server.url}/predictions/stateful", content=b"5", timeout=60)
    assert first.status_code == 200, first.text
    sequence_id = first.headers[SEQ_HEADER]
    assert sequence_id.startswith("ts-seq-") and first.text == "5"
    again = httpx.post(
        f"{server.url}/predictions/stateful",
        content=b"2",
        headers={SEQ_HEADER: sequence_id},
        timeout=60,
    )
    assert again.status_code == 200 and again.text == "7"


def test_grpc_stream_predictions2_sequencesinterleaved(server, ts) -> None:  # noqa: F811
    stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(server.channel)

    def run_one(i: int) -> list:
        requests = (
            ts.inference_pb2.PredictionsRequest(
                model_name="stateful",
                sequence_id=f"grpc_{i}",
                input={"data": str(n * (i + 1)).encode()},
            )
            for n in NUMBERS
        )
        answers = []
        for response in stub.StreamPredictions2(requests, timeout=120):
            assert response.sequence_id == f"grpc_{i}"
            assert not response.HasField("status") or response.status.code == 0, response.status
            answers.append(int(response.prediction))
        return answers

    results = interleaved(4, run_one)
    for i, answers in results.items():
        assert answers == [t * (i + 1) for t in _totals()], i


def _v2(server, params: dict, value: int, model: str = "stateful_oip") -> httpx.Response:
    body = {
        "inputs": [{"name": "data", "datatype": "BYTES", "shape": [1], "data": [str(value)]}],
        "parameters": params,
    }
    return httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=60)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({}, "sequence_id"),
        ({"sequence_id": -3}, "sequence_id"),
        ({"sequence_id": 2.5}, "sequence_id"),
        ({"sequence_id": ["a"]}, "sequence_id"),
        ({"sequence_id": 9, "sequence_start": "true"}, "sequence_start"),
    ],
)
def test_oip_bad_sequence_parameters_are_400s_naming_the_field(server, params, field) -> None:
    r = _v2(server, params, 1)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert field in error and "Traceback" not in error and "/" not in error.split(":")[0]


def test_oip_sequence_needs_its_start_and_is_refused_once_ended(server) -> None:
    r = _v2(server, {"sequence_id": 4242}, 1)
    assert r.status_code == 400 and "sequence_start" in r.json()["error"]
    r = _v2(server, {"sequence_id": 4242, "sequence_start": True}, 1)
    assert r.status_code == 200 and r.json()["parameters"]["sequence_id"] == 4242
    assert _v2(server, {"sequence_id": 4242, "sequence_end": True}, 1).status_code == 200
    r = _v2(server, {"sequence_id": 4242}, 1)
    assert r.status_code == 400 and "has ended" in r.json()["error"]


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_oip_sequence_of_compressed_requests(server, algorithm: str) -> None:
    """Triton takes gzip and deflate bodies; so does a sequence model (the plane read the
    compressed bytes for the sequence's parameters: 400 "not valid JSON")."""
    client = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
    totals = []
    try:
        for i, n in enumerate(NUMBERS[:3]):
            data = triton_http.InferInput("data", [1], "BYTES")
            data.set_data_from_numpy(np.array([str(n).encode()], dtype=object))
            result = client.infer(
                "stateful_oip",
                [data],
                sequence_id=f"zipped-{algorithm}",
                sequence_start=i == 0,
                sequence_end=i == 2,
                request_compression_algorithm=algorithm,
            )
            totals.append(int(result.as_numpy("output0")))
    finally:
        client.close()
    assert totals == _totals()[:3]


def test_oip_sequence_request_in_an_unknown_encoding_is_a_415(server) -> None:
    """The worker's answer to any other model's (tests/handlers/test_oip_codec.py), not a 400."""
    body = json.dumps({"inputs": [], "parameters": {"sequence_id": 5}}).encode()
    r = httpx.post(
        f"{server.url}/v2/models/stateful_oip/infer",
        content=body,
        headers={"Content-Encoding": "br", "Content-Type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 415, r.text
    assert "unsupported Content-Encoding 'br'" in r.json()["error"]


def test_describe_shows_the_sequence_settings_and_open_sequences(server) -> None:
    mgmt = f"http://127.0.0.1:{server.live.server.state.ports.management}"
    (desc,) = httpx.get(f"{mgmt}/models/stateful", timeout=30).json()
    assert desc["stateful"] is True and desc["maxNumSequence"] == 4
    assert desc["sequenceMaxIdleMSec"] == 10 and desc["maxSequenceJobQueueSize"] == 10
    assert isinstance(desc["openSequences"], int)
    assert json.dumps(desc)  # the whole answer is JSON


def test_describe_shows_torchserve_s_sequence_keys_as_torchserve_does(server) -> None:
    recorded = json.loads((RECORDS / "torchserve_0.12.json").read_text())
    (theirs,) = recorded["describe"]
    mgmt = f"http://127.0.0.1:{server.live.server.state.ports.management}"
    (ours,) = httpx.get(f"{mgmt}/models/stateful", timeout=30).json()
    keys = (
        *("stateful", "sequenceMaxIdleMSec", "sequenceTimeoutMSec", "maxNumSequence"),
        *("maxSequenceJobQueueSize", "minWorkers", "maxWorkers", "batchSize"),
    )
    assert {k: ours[k] for k in keys} == {k: theirs[k] for k in keys}


def test_an_integer_id_and_its_text_name_one_sequence(server) -> None:
    """The handler reads the id as text (its header), so 31 and "31" must not be two
    sequences sharing one state on one worker (the start of 31 answered 110, not 100)."""
    model = "stateful_dying"  # one worker: both would run there
    assert _v2(server, {"sequence_id": "31", "sequence_start": True}, 10, model).status_code == 200
    r = _v2(server, {"sequence_id": 31}, 1, model)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [11], r.text
    assert _v2(server, {"sequence_id": "31", "sequence_end": True}, 1, model).status_code == 200
    r = _v2(server, {"sequence_id": 31}, 1, model)
    assert r.status_code == 400 and "has ended" in r.json()["error"], r.text


def test_a_start_for_an_open_id_joins_it_as_triton_and_torchserve_do(server) -> None:
    """A gRPC stream client restarts a sequence it never ended (Triton: the previous one ends
    early; TorchServe: its job group takes the request): the start runs after it, in order, on
    the sequence's worker (the example's handler keeps its total: +5 on 30 or 36). Or it sends
    an id's end and its next start without waiting: whether the end is answered before the
    start arrives is the machine's timing, so the start either joins the sequence (its total
    goes on: 16) or opens a new one (10); either way every request is answered, in order. Was:
    400 "already open" for the start, then "has ended" for the rest of the new sequence."""
    answers: queue.Queue = queue.Queue()
    with oip_client(server.live, "grpc") as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        steps = [(1, True, False), (2, False, False), (3, False, True), (10, True, False)]
        steps += [(20, False, False), (5, True, False), (5, True, True)]  # open: the starts join
        for value, start, end in steps:
            data = triton_grpc.InferInput("data", [1], "BYTES")
            data.set_data_from_numpy(np.array([str(value).encode()], dtype=object))
            client.async_stream_infer(
                "stateful_oip", [data], sequence_id=7007, sequence_start=start, sequence_end=end
            )
        got = [answers.get(timeout=120) for _ in steps]
        client.stop_stream()
    assert [error for _, error in got] == [None] * len(steps)
    totals = [int(result.as_numpy("output0").reshape(-1)[0]) for result, _ in got]
    assert totals[:3] == [1, 3, 6] and totals[3] in (10, 16), totals
    assert totals[4:] == [totals[3] + 20, totals[3] + 25, totals[3] + 30], totals
    r = _v2(server, {"sequence_id": 7007}, 1)
    assert r.status_code == 400 and "has ended" in r.json()["error"], r.text


def test_an_id_that_corrid_s_type_cannot_hold_is_a_400(server) -> None:
    """Was a 413 "input too large to decode (OverflowError)" from numpy."""
    params = {"sequence_id": 1 << 40, "sequence_start": True, "sequence_end": True}
    r = _v2(server, params, 1, "stateful_corrid")
    assert r.status_code == 400, r.text
    assert "CORRID" in r.json()["error"] and "INT32" in r.json()["error"], r.text


def test_a_worker_that_dies_ends_its_sequences_with_a_clear_error(server) -> None:
    mgmt = f"http://127.0.0.1:{server.live.server.state.ports.management}"
    start = {"sequence_id": "doomed", "sequence_start": True}
    assert _v2(server, start, 2, "stateful_dying").json()["outputs"][0]["data"] == [2]
    assert _v2(server, {"sequence_id": "doomed"}, 3, "stateful_dying").json()["outputs"][0][
        "data"
    ] == [5]
    (desc,) = httpx.get(f"{mgmt}/models/stateful_dying", timeout=30).json()
    os.kill(desc["workers"][0]["pid"], signal.SIGKILL)
    # Whether this request reaches the scheduler before or after the frontend sees the death,
    # it is refused for it: never run on the restarted worker's fresh state.
    r = _v2(server, {"sequence_id": "doomed"}, 4, "stateful_dying")
    assert r.status_code in (400, 503), r.text
    assert "died" in r.json()["error"]
    r = _v2(server, {"sequence_id": "doomed"}, 4, "stateful_dying")
    assert r.status_code == 400 and "doomed" in r.json()["error"] and "died" in r.json()["error"]
    metrics = httpx.get(
        f"http://127.0.0.1:{server.live.server.state.ports.metrics}/metrics", timeout=30
    ).text
    assert 'torchbay_sequences_ended_total{model="stateful_dying",reason="worker"' in metrics
    assert 'torchbay_open_sequences{model="stateful",version="1.0"}' in metrics


def test_grpc_without_a_sequence_id_gets_the_one_the_server_made(server, ts) -> None:  # noqa: F811
    """A start without an id gets the id the server makes; neither an id nor a start is
    refused, as TorchServe 0.12 refuses it ("Parameter sequenceId is required.")."""
    stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(server.channel)
    bare = ts.inference_pb2.PredictionsRequest(model_name="stateful", input={"data": b"6"})
    (refused,) = list(stub.StreamPredictions2(iter([bare]), timeout=120))
    assert refused.status.message == "Parameter sequenceId is required."
    start = {"data": b"6", "ts_request_sequence_start": b"true"}
    first = ts.inference_pb2.PredictionsRequest(model_name="stateful", input=start)
    (answer,) = list(stub.StreamPredictions2(iter([first]), timeout=120))
    assert answer.sequence_id.startswith("ts-seq-") and answer.prediction == b"6"
    again = ts.inference_pb2.PredictionsRequest(
        model_name="stateful", sequence_id=answer.sequence_id, input={"data": b"1"}
    )
    (answer2,) = list(stub.StreamPredictions2(iter([again]), timeout=120))
    assert answer2.sequence_id == answer.sequence_id and answer2.prediction == b"7"


def test_a_start_or_an_end_whose_client_left_while_queued_never_happened(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """A queued request whose caller left never runs: its sequence goes on as if it had never
    been sent. Its start left: the id is not open (it may start again; no place of
    maxNumSequence is kept). Its end left: the sequence is not ended."""
    store = build_store(tmp_path_factory, "seq-left", {"probe": str(ASSETS / "probe_handler.py")})
    settings = {"minWorkers": 1, "maxWorkers": 1, "batchSize": 1, "sequenceBatching": True}
    settings |= {"maxNumSequence": 3, "maxSequenceJobQueueSize": 4}
    with running(store, models={"probe": {"1.0": {"marName": "probe.mar", **settings}}}) as live:
        url, mv = f"{live.url}/predictions/probe", live.server.registry.resolve("probe")

        def post(seq: str, flag: str = "", timeout: float = 60, **body: object) -> httpx.Response:
            headers = {SEQ_HEADER: seq, **({f"ts_request_sequence_{flag}": "true"} if flag else {})}
            return httpx.post(url, json=body, headers=headers, timeout=timeout)

        assert post("b", "start").status_code == 200
        gate = tmp_path / "gate"
        with ThreadPoolExecutor(1) as pool:
            busy = pool.submit(post, "a", "start", until=str(gate))  # holds the one worker
            until(lambda: batch_running(live, "probe"), "a's request runs")
            for seq, flag in (("b", "end"), ("c", "start")):  # queued behind it, then gone
                with pytest.raises(httpx.ReadTimeout):
                    post(seq, flag, timeout=0.5)
            until(lambda: mv.cancelled["queued"] == 2, "both callers' leaving seen")
            gate.touch()
            assert busy.result().status_code == 200
        assert post("c", "start").status_code == 200  # was: 400 "already open"
        assert post("b").status_code == 200  # was: 400 "has ended"
        assert post("b", "end").status_code == 200
        assert post("d", "start").status_code == 200  # was: 503, the 3 places held


def test_without_an_idle_limit_id_less_requests_do_not_hold_every_place(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """TorchServe's defaults (no ``sequenceMaxIdleMSec``): its job group is dropped once idle,
    so each request without an id is answered. Was: the first one's sequence stayed open for
    ever and every later new sequence got 503 (maxNumSequence)."""
    store = build_store(tmp_path_factory, "seq-idless", {"probe": str(ASSETS / "probe_handler.py")})
    settings = {"minWorkers": 1, "maxWorkers": 1, "batchSize": 1, "sequenceBatching": True}
    with running(store, models={"probe": {"1.0": {"marName": "probe.mar", **settings}}}) as live:
        url = f"{live.url}/predictions/probe"
        named = [httpx.post(url, json={}, timeout=60) for _ in range(3)]
        assert [r.status_code for r in named] == [200] * 3, named[-1].text
        again = {SEQ_HEADER: named[0].headers[SEQ_HEADER]}  # reopens on its worker
        assert httpx.post(url, json={}, headers=again, timeout=60).status_code == 200


@pytest.mark.parametrize(
    ("yaml", "named"),
    [
        ("sequence_batching:\n  max_sequence_idle_microseconds: .inf\n", "sequence_max_idle_ms"),
        ("sequenceBatching: true\npriorityLevels: 2\ndefaultPriorityLevel: 1\n", "priorityLevels"),
    ],
)
def test_an_archive_whose_sequence_settings_cannot_hold_is_refused_400(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, yaml: str, named: str
) -> None:
    """A model-config.yaml with ``max_sequence_idle_microseconds: .inf`` (or ``.nan``): its
    registration was a 500 (OverflowError, a traceback in the log); now a 400 naming it. A
    sequence model with priority levels (Triton's config has sequence_batching or
    dynamic_batching, never both): the levels were quietly ignored; now a 400 naming them."""
    config = tmp_path / "model-config.yaml"
    config.write_text(yaml)
    store = build_store(
        tmp_path_factory, "idle-inf", {"probe": str(ASSETS / "probe_handler.py")}, {"probe": config}
    )
    with running(store, enable_model_api=True) as live:
        r = httpx.post(f"{live.management_url}/models", params={"url": "probe.mar"}, timeout=60)
    assert r.status_code == 400, r.text
    assert named in r.json()["message"]


@contextlib.contextmanager
def _one_model(factory: pytest.TempPathFactory, name: str, settings: str) -> Iterator[Any]:
    """A server of the stateful example alone, packed as ``name`` with one worker, batch size
    1, a handler cache of 4 and ``settings`` (YAML lines) in its model-config.yaml."""
    root, work = factory.mktemp(f"{name}-store"), factory.mktemp(f"{name}-build")
    config = work / f"{name}.yaml"
    config.write_text(
        "minWorkers: 1\nmaxWorkers: 1\nbatchSize: 1\nhandler:\n  cache:\n    capacity: 4\n"
        + settings
    )
    archive(root, work, name, config)
    with contextlib.contextmanager(served)(root) as server:
        yield server


def test_without_an_idle_limit_abandoned_oip_sequences_free_their_places(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A model whose model-config.yaml sets no ``sequenceMaxIdleMSec``: an OIP sequence
    (``sequence_start``) that its client abandons closes after Triton's default idle limit,
    1 s, so a new sequence is served once the places of ``maxNumSequence`` were all taken,
    and the abandoned id's next request says why it is refused. Was: never closed, every new
    sequence a 503 for ever."""
    config = "maxNumSequence: 2\nsequenceBatching: true\n"
    with _one_model(tmp_path_factory, "stateful_noidle", config) as server:
        for sid in ("a", "b"):  # abandoned: never ended
            r = _v2(server, {"sequence_id": sid, "sequence_start": True}, 1, "stateful_noidle")
            assert r.status_code == 200, r.text
        answers: list[httpx.Response] = []

        def served_new() -> bool:
            params = {"sequence_id": "c", "sequence_start": True}
            answers.append(_v2(server, params, 5, "stateful_noidle"))
            if answers[-1].status_code == 503:  # both places still held: retry later
                time.sleep(0.1)
            return answers[-1].status_code != 503

        until(served_new, "a new sequence is served", timeout=60)
        assert answers[-1].status_code == 200, answers[-1].text
        r = _v2(server, {"sequence_id": "a"}, 2, "stateful_noidle")
        assert r.status_code == 400 and "Triton's default idle limit" in r.json()["error"]


def test_a_sequence_waiting_for_a_slot_past_its_request_timeout_is_answered_503(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Triton's ``timeout`` parameter on a sequence model (``direct``, one lane, held by an
    open sequence): a new sequence that waits for a slot past its request's timeout is
    rejected 503 "timeout", as Triton's backlog is UNAVAILABLE; once the lane is free a new
    start runs. Was: the timeout was ignored and the request waited for the lane."""
    config = "maxNumSequence: 2\nsequenceMaxIdleMSec: 60000\nsequenceStrategy: direct\n"
    with _one_model(
        tmp_path_factory, "stateful_direct", config + "sequenceBatching: true\n"
    ) as server:
        start = {"sequence_id": "a", "sequence_start": True}
        assert _v2(server, start, 1, "stateful_direct").status_code == 200  # a holds the lane
        waits = {"sequence_id": "b", "sequence_start": True, "timeout": 200_000}
        r = _v2(server, waits, 5, "stateful_direct")
        assert r.status_code == 503 and "timeout" in r.json()["error"], r.text
        end = {"sequence_id": "a", "sequence_end": True}
        assert _v2(server, end, 2, "stateful_direct").status_code == 200  # the lane is free
        again = {"sequence_id": "b", "sequence_start": True, "sequence_end": True}
        r = _v2(server, again, 5, "stateful_direct")
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [5], r.text
