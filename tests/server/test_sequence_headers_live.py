"""TorchServe's ``ts_header_key_sequence_id`` / ``_start`` / ``_end`` keys on a real server: the
renamed headers name, start and end a sequence over TorchServe REST and gRPC, the worker's
handler gets them under the new names (``context.header_key_sequence_*``,
``context.get_sequence_id``), and a continuous-batching handler ends a sequence with the renamed
end header. The handler of the ``seen`` model answers what it was given (the id its context
reads, its context's keys, the request's sequence headers, and its count of requests for that
id); TorchServe 0.12's answers to the same requests are in
tests/data/torchserve/stateful_renamed/torchserve_0.12.json."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import grpc
import httpx
import pytest

from torchbay.archiver.package import ArchiveOptions, package

from .stateful_store import EXAMPLE, archive, served
from .test_grpc import ts  # noqa: F401  (the fixture: stubs generated from TorchServe's protos)

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[1] / "data" / "torchserve" / "stateful_renamed"
NAMES = {
    "ts_header_key_sequence_id": "Session-Id",
    "ts_header_key_sequence_start": "session-start",
    "ts_header_key_sequence_end": "session-end",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    root = tmp_path_factory.mktemp("renamed-store")
    work = tmp_path_factory.mktemp("renamed-build")
    seen = work / "seen.yaml"  # the recorded model's, with room for every test's sequences
    text = (DATA / "model-config.yaml").read_text()
    seen.write_text(text.replace("maxNumSequence: 4", "maxNumSequence: 32"))
    options = ArchiveOptions(
        model_name="seen",
        version="1.0",
        handler=str(DATA / "seen_handler.py"),
        config_file=seen,
        export_path=root,
    )
    package(options)
    recorded = {
        **vars(options),
        "model_name": "recorded",
        "config_file": DATA / "model-config.yaml",
    }
    package(ArchiveOptions(**recorded))
    continuous = work / "continuous.yaml"
    shutil.copy(EXAMPLE / "sequence_continuous_batching" / "model-config.yaml", continuous)
    with continuous.open("a") as f:
        f.write("sequenceMaxIdleMSec: 60000\nminWorkers: 1\nmaxWorkers: 1\n")
    archive(root, work, "continuous", continuous, example="sequence_continuous_batching")
    yield from served(root, **NAMES)


def _seen(server, body: str, headers: dict[str, str]) -> tuple[httpx.Response, dict]:
    r = httpx.post(f"{server.url}/predictions/seen", content=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    return r, r.json()


def _generated(value: object) -> object:
    """``value`` with each server-made sequence id replaced by ``ts-seq-<uuid>``."""
    return json.loads(re.sub(r"ts-seq-[0-9a-f-]{36}", "ts-seq-<uuid>", json.dumps(value)))


def test_the_handler_sees_what_torchserve_s_handler_sees(server) -> None:
    """TorchServe 0.12's answers, with the worker's TS_REQUEST_SEQUENCE_* variables set to the
    renamed headers (without them its context reads the default names: get_sequence_id is
    None; torchbay tells the worker the server's names). TorchServe sets no sequence header in
    the response of this handler; torchbay sends the id back (docs/sequences.md)."""
    record = json.loads((DATA / "torchserve_0.12.json").read_text())
    for theirs in record["with_env_answers"]:
        sent = theirs["request"]
        r = httpx.post(
            f"{server.url}/predictions/recorded",
            content=sent["body"],
            headers=sent["headers"],
            timeout=60,
        )
        assert r.status_code == theirs["status"], r.text
        assert _generated(r.json()) == _generated(theirs["body"]), sent


def test_the_renamed_id_header_names_the_sequence(server) -> None:
    """Was: the header was not read, so each request started a sequence of its own (a new
    ``ts-seq-`` id, its count 1) and the handler's ``get_sequence_id`` read None."""
    for n in (1, 2):
        r, seen = _seen(server, "x", {"session-id": "s1"})
        assert seen["id"] == "s1" and seen["n"] == n, seen
        assert seen["headers"] == {"session-id": "s1"}, seen
        assert r.headers["session-id"] == "s1"  # sent back, as every sequence answer is
    assert seen["keys"] == ["session-id", "session-start", "session-end"]


def test_a_request_without_the_id_starts_a_sequence_named_in_the_renamed_header(server) -> None:
    r, seen = _seen(server, "x", {})
    assert seen["id"].startswith("ts-seq-") and seen["n"] == 1, seen
    assert seen["headers"] == {"session-id": seen["id"], "session-start": "true"}, seen
    assert r.headers["session-id"] == seen["id"]
    assert "ts_request_sequence_id" not in r.headers


def test_torchserve_s_own_header_name_is_an_ordinary_header_once_renamed(server) -> None:
    """As TorchServe 0.12: the request starts a sequence of its own and the handler sees the
    client's header as it came."""
    _, seen = _seen(server, "x", {"ts_request_sequence_id": "s2"})
    assert seen["id"].startswith("ts-seq-"), seen
    assert seen["headers"]["ts_request_sequence_id"] == "s2"


def test_the_renamed_end_header_ends_the_sequence(server) -> None:
    _, seen = _seen(server, "x", {"session-id": "ending"})
    _, seen = _seen(server, "x", {"session-id": "ending", "session-end": "true"})
    assert seen["n"] == 2 and seen["headers"]["session-end"] == "true", seen
    r = httpx.post(f"{server.url}/predictions/seen", content="x", headers={"session-id": "ending"})
    assert r.status_code == 400 and "ending" in r.json()["message"], r.text
    _, seen = _seen(server, "x", {"session-id": "ending", "session-start": "true"})
    assert seen["n"] == 3 and seen["headers"]["session-start"] == "true", seen


def test_grpc_input_entries_of_the_renamed_names_start_and_end(server, ts) -> None:  # noqa: F811
    stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(server.channel)
    request = ts.inference_pb2.PredictionsRequest

    def predict(**inputs: bytes) -> tuple[str, dict]:
        named = {k.replace("_", "-"): v for k, v in inputs.items()}
        answer = stub.Predictions(
            request(model_name="seen", sequence_id="g1", input={"data": b"x", **named}),
            timeout=60,
        )
        return answer.sequence_id, json.loads(answer.prediction)

    sequence_id, seen = predict()
    assert sequence_id == "g1" and seen["id"] == "g1" and seen["n"] == 1, seen
    _, seen = predict(session_end=b"true")
    assert seen["n"] == 2 and seen["headers"]["session-end"] == "true", seen
    with pytest.raises(grpc.RpcError) as info:
        predict()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    _, seen = predict(session_start=b"true")
    assert seen["n"] == 3, seen


def test_a_handler_ends_its_sequence_with_the_renamed_end_header(server) -> None:
    """TorchServe's continuous-batching example sets ``context.header_key_sequence_end`` on
    the answer to 0. Was: the frontend read only ``ts_request_sequence_end``, so the ended
    sequence took the next request (and the example's handler, which had dropped its state,
    failed on it)."""
    url = f"{server.url}/predictions/continuous"
    with httpx.Client(timeout=60) as client:
        first = client.post(url, content=b"2")
        assert first.status_code == 200 and first.text == "2", first.text
        sequence_id = first.headers["session-id"]
        headers = {"session-id": sequence_id}
        end = client.post(url, content=b"0", headers=headers)
        assert end.status_code == 200 and end.headers["session-end"] == sequence_id, end.text
        after = client.post(url, content=b"5", headers=headers)
    assert after.status_code == 400, after.text
    assert sequence_id in after.json()["message"] and "ended" in after.json()["message"]
