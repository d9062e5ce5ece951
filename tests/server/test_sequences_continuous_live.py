"""TorchServe's sequence continuous batching example on a real server (serving/continuous.py,
handlers/runtime/continuous.py): its handler and model-config.yaml unchanged (2 workers, batch
size 4, ``sequenceMaxIdleMSec: 10``, ``continuousBatching: true``), over TorchServe REST and
gRPC ``StreamPredictions2``, several sequences at once; the scenarios of TorchServe's own test
(test/pytest/test_example_stateful_sequence_continuous_batching_http.py), compared with what
TorchServe 0.12 answered (tests/data/torchserve/stateful/continuous_*.json, see the README).

The handler adds each request's number to its sequence's total (an LRU per worker process) and
keeps each sequence's flags in ``context.cache``: an odd number streams its total (a part per
handler call, one call a second) until the sequence's next request cancels it (-1) or ten
parts have gone; 0 ends the sequence. So a request that ran on the wrong worker, or a cancel
that could not join a call while the stream goes on, would answer wrong."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from types import SimpleNamespace

import grpc
import httpx
import pytest

from .conftest import LiveServer, make_config
from .stateful_store import EXAMPLE, RECORDS, SEQ_HEADER, archive, interleaved
from .test_grpc import ts  # noqa: F401  (the fixture: stubs generated from TorchServe's protos)

pytestmark = pytest.mark.slow

CONFIG = EXAMPLE / "sequence_continuous_batching" / "model-config.yaml"
END_HEADER = "ts_request_sequence_end"


def _recorded(config: str) -> dict:
    """TorchServe 0.12's answers (``file``: the example's model-config.yaml; ``idle60s``: the
    same with the 60 s idle limit its Readme.md shows)."""
    name = "continuous_torchserve_0.12.json" if config == "file" else "continuous_idle60s.json"
    return json.loads((RECORDS / name).read_text())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    root = tmp_path_factory.mktemp("seqcb-store")
    work = tmp_path_factory.mktemp("seqcb-build")
    archive(root, work, "stateful", CONFIG, example="sequence_continuous_batching")
    live = LiveServer(make_config(root, load_models=["all"])).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{live.server.state.ports.grpc_inference}")
    try:
        yield SimpleNamespace(live=live, url=f"{live.url}/predictions/stateful", channel=channel)
    finally:
        channel.close()
        live.stop()


def _sequence(client: httpx.Client, url: str, numbers: list[int]) -> tuple[str, list[str]]:
    """One sequence over REST: the first request without an id (the server names it)."""
    headers: dict[str, str] = {}
    answers = []
    for n in numbers:
        r = client.post(url, content=str(n).encode(), headers=headers)
        assert r.status_code == 200, r.text
        headers = {SEQ_HEADER: r.headers[SEQ_HEADER]}
        answers.append(r.text)
    return headers[SEQ_HEADER], answers


def test_rest_sequences_at_once_keep_their_totals(server) -> None:
    """TorchServe's test_infer_stateful, with four sequences (two per worker) instead of two."""

    def run_one(i: int) -> list[str]:
        with httpx.Client(timeout=60) as client:
            step = 2 * (i + 1)
            return _sequence(client, server.url, [step * k for k in range(1, 6)])[1]

    results = interleaved(4, run_one)
    for i, answers in results.items():
        step = 2 * (i + 1)
        assert answers == [str(step * t) for t in (1, 3, 6, 10, 15)], i
    # TorchServe 0.12 answers the same with the Readme's idle limit ("2 6 12 20 30" and
    # "4 12 24 40 60"); with the example's file (10 ms) it fails the 4th request (503).
    theirs = _recorded("idle60s")["two_sequences"]
    assert [a["body"] for a in theirs["seq_0"]] == results[0]
    assert [a["body"] for a in theirs["seq_1"]] == results[1]


def test_the_handler_ends_a_sequence_and_its_next_request_is_refused(server) -> None:
    with httpx.Client(timeout=60) as client:
        sequence_id, answers = _sequence(client, server.url, [2, 4])
        assert answers == ["2", "6"]
        r = client.post(server.url, content=b"0", headers={SEQ_HEADER: sequence_id})
        assert r.status_code == 200 and r.text == "6"
        assert r.headers[END_HEADER] == sequence_id  # the handler's header reaches the client
        assert "ts_stream_next" not in r.headers
        after = client.post(server.url, content=b"5", headers={SEQ_HEADER: sequence_id})
    theirs = _recorded("idle60s")["end_then_more"]
    assert [a["body"] for a in theirs[:3]] == ["2", "6", "6"] and END_HEADER in theirs[2]["headers"]
    # TorchServe 0.12 answers 503 "Prediction failed" (its handler raises on the unknown id).
    assert after.status_code == 400, after.text
    error = after.json()["message"]
    assert sequence_id in error and "ended" in error and "Traceback" not in error


def _stream_then_cancel(server, client: httpx.Client, sequence_id: str) -> tuple[str, str]:
    """A streaming request ({"input": 3}) and, once its first part is in, the sequence's
    cancel (-1): (the streamed text, the cancel's answer)."""
    headers = {SEQ_HEADER: sequence_id}
    streamed = ""
    cancel = None
    with client.stream("POST", server.url, json={"input": 3}, headers=headers) as r:
        assert r.status_code == 200 and r.headers.get("transfer-encoding") == "chunked"
        assert r.headers[SEQ_HEADER] == sequence_id
        for chunk in r.iter_text():
            streamed += chunk
            if cancel is None:
                with httpx.Client(timeout=60) as other:
                    cancel = other.post(server.url, content=b"-1", headers=headers)
    assert cancel is not None and cancel.status_code == 200, cancel
    return streamed, cancel.text


def test_a_cancel_joins_the_call_of_its_sequence_s_streaming_request(server) -> None:
    """TorchServe's test_infer_stateful_cancel: four sequences in turn, each closed by its 0,
    the cancel sent once the first part is in (TorchServe's test sleeps 1 s instead)."""
    theirs = _recorded("idle60s")["cancel"]  # TorchServe 0.12: "5" x3, "-1", then "5"
    assert set(theirs["stream"]["body"]) == {"5"} and len(theirs["stream"]["body"]) < 11
    assert (theirs["cancel"]["body"], theirs["close"]["body"]) == ("-1", "5")
    with httpx.Client(timeout=60) as client:
        for _ in range(4):
            sequence_id, answers = _sequence(client, server.url, [2])
            assert answers == ["2"]
            streamed, cancelled = _stream_then_cancel(server, client, sequence_id)
            # 2 + 3 = 5, once per handler call until the cancel's call; ten more calls
            # (one a second) had it not joined.
            assert set(streamed) == {"5"} and 2 <= len(streamed) < 11, streamed
            assert cancelled == "-1"
            r = client.post(server.url, content=b"0", headers={SEQ_HEADER: sequence_id})
            assert r.status_code == 200 and r.text == "5"
            assert r.headers[END_HEADER] == sequence_id


def _grpc_sequence(ts, stub, numbers: list[bytes]) -> tuple[str, list[str]]:  # noqa: F811
    """One StreamPredictions2 stream: the first request a start without an id, the rest with
    the id its answer named, each sent once the previous one is answered."""
    requests: queue.Queue = queue.Queue()
    start = {"data": numbers[0], "ts_request_sequence_start": b"true"}
    requests.put(ts.inference_pb2.PredictionsRequest(model_name="stateful", input=start))
    answers: list[str] = []
    sequence_id = ""
    pending = list(numbers[1:])
    for response in stub.StreamPredictions2(iter(requests.get, None), timeout=120):
        assert not response.HasField("status") or response.status.code == 0, response.status
        sequence_id = sequence_id or response.sequence_id
        assert response.sequence_id == sequence_id
        answers.append(response.prediction.decode())
        if not pending:
            requests.put(None)
            continue
        data = pending.pop(0)
        message = ts.inference_pb2.PredictionsRequest(
            model_name="stateful", sequence_id=sequence_id, input={"data": data}
        )
        requests.put(message)
    return sequence_id, answers


def test_grpc_stream_predictions2_sequences_at_once(server, ts) -> None:  # noqa: F811
    stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(server.channel)

    def run_one(i: int) -> list[str]:
        step = 2 * (i + 1)
        return _grpc_sequence(ts, stub, [str(step * k).encode() for k in range(1, 6)])[1]

    results = interleaved(4, run_one)
    for i, answers in results.items():
        step = 2 * (i + 1)
        assert answers == [str(step * t) for t in (1, 3, 6, 10, 15)], i


def test_grpc_streams_the_parts_of_a_continued_request(server, ts) -> None:  # noqa: F811
    """An odd number over StreamPredictions2: its parts come as responses of the stream, and
    the sequence's cancel, on a second stream, joins a later call."""
    stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(server.channel)
    sequence_id, answers = _grpc_sequence(ts, stub, [b"4"])
    assert answers == ["4"]
    stream = stub.StreamPredictions2(
        iter(
            [
                ts.inference_pb2.PredictionsRequest(
                    model_name="stateful", sequence_id=sequence_id, input={"data": b"3"}
                )
            ]
        ),
        timeout=120,
    )
    parts = [next(stream).prediction]
    cancel = ts.inference_pb2.PredictionsRequest(
        model_name="stateful", sequence_id=sequence_id, input={"data": b"-1"}
    )
    (answer,) = list(stub.StreamPredictions2(iter([cancel]), timeout=120))
    parts += [r.prediction for r in stream]
    assert answer.prediction == b"-1" and answer.sequence_id == sequence_id
    assert set(parts) == {b"7"} and 2 <= len(parts) < 11, parts


def test_the_readme_s_grpc_client_is_answered_with_a_clear_error(server, ts) -> None:  # noqa: F811
    """The Readme's ``infer_stream2 stateful seq_0 sample1.txt,...`` names a sequence that was
    never started, which this handler cannot serve (it raises KeyError): every request is
    answered with an error status, none with a traceback. TorchServe 0.12 closes the stream
    without an answer (its frontend raised a NullPointerException), recorded as []."""
    assert _recorded("file")["grpc_readme"] == []
    stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(server.channel)
    requests = [
        ts.inference_pb2.PredictionsRequest(
            model_name="stateful",
            sequence_id="seq_0",
            input={"data": (EXAMPLE / "sample" / f"sample{i}.txt").read_bytes()},
        )
        for i in (1, 2, 3)
    ]
    answers = list(stub.StreamPredictions2(iter(requests), timeout=120))
    assert len(answers) == 3
    for answer in answers:
        assert answer.sequence_id == "seq_0" and answer.status.code != 0
        assert "Traceback" not in answer.status.message and "KeyError" in answer.status.message


def test_describe_shows_continuous_batching(server) -> None:
    mgmt = f"http://127.0.0.1:{server.live.server.state.ports.management}"
    (desc,) = httpx.get(f"{mgmt}/models/stateful", timeout=30).json()
    assert desc["continuousBatching"] is True and desc["stateful"] is True
    assert desc["batchSize"] == 4 and desc["minWorkers"] == desc["maxWorkers"] == 2
