"""Streaming on a live server (tests/server/assets/stream_handler.py): TorchServe's
send_intermediate_predict_response as chunked HTTP, handlers that yield, the generate extension
(JSON and server-sent events), a client leaving mid-stream, errors mid-stream.

"Part 1 arrived while the handler was blocked" is proven by construction: the handler waits for
a gate file after sending part 1, and the test creates that file only after reading part 1."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from torchbay.server.serving import protocol as p

from .conftest import ASSETS, LiveServer, build_store, longest_gap, make_config


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    handler = str(ASSETS / "stream_handler.py")
    names = ("stream", "paced", "batched")
    store = build_store(tmp_path_factory, "stream-store", dict.fromkeys(names, handler))
    one = {"minWorkers": 1, "maxWorkers": 1}
    models = {
        "stream": {"1.0": {"marName": "stream.mar", **one}},
        # responseTimeout bounds the wait for each part, not the whole stream
        "paced": {"1.0": {"marName": "paced.mar", "responseTimeout": 3, **one}},
        "batched": {
            "1.0": {"marName": "batched.mar", "batchSize": 2, "maxBatchDelay": 5000, **one}
        },
    }
    config = make_config(store, models=models, load_models=[f"{n}.mar" for n in names])
    live = LiveServer(config).start()
    yield live
    live.stop()


def _poll(path: Path, deadline_s: float = 60.0) -> str:
    end = time.monotonic() + deadline_s
    while not path.exists():
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.01)
    return path.read_text()


def _first_chunk(response: httpx.Response) -> tuple[bytes, Iterator[bytes]]:
    """The first (non-empty) chunk, and the iterator over the rest."""
    chunks = response.iter_raw()
    for chunk in chunks:
        if chunk:
            return chunk, chunks
    raise AssertionError("the stream ended without a part")


def _plain_request_served(server: LiveServer) -> None:
    answer = httpx.post(f"{server.url}/predictions/stream", json={"x": 1}, timeout=60)
    assert answer.status_code == 200
    assert answer.json() == {"plain": True}


def _stream(server: LiveServer, body: dict[str, Any], path: str = "/predictions/stream"):
    return httpx.stream("POST", server.url + path, json=body, timeout=60)


def test_part_arrives_while_the_handler_is_blocked(server: LiveServer, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    with _stream(server, {"parts": ["one,", "two,"], "gate": str(gate)}) as response:
        assert response.status_code == 200
        assert response.headers["transfer-encoding"] == "chunked"
        assert "content-length" not in response.headers
        first, chunks = _first_chunk(response)
        assert first == b"one,"
        assert not gate.exists()  # the handler cannot have returned: it waits for the gate
        gate.touch()
        rest = b"".join(chunks)
    assert rest == b"two,end"


def test_non_streaming_handler_answers_one_plain_response(server: LiveServer) -> None:
    answer = httpx.post(f"{server.url}/predictions/stream", json={"x": 1}, timeout=60)
    assert answer.status_code == 200
    assert answer.headers["content-length"] == str(len(answer.content))
    assert "transfer-encoding" not in answer.headers


def test_client_leaving_stops_the_handler_and_frees_the_worker(
    server: LiveServer, tmp_path: Path
) -> None:
    gate, stopped = tmp_path / "gate", tmp_path / "stopped"
    with _stream(server, {"until_stopped": str(stopped), "gate": str(gate)}) as response:
        assert _first_chunk(response)[0] == b"p0"
    # The client is gone (the connection closed with the stream unread): let the handler go on.
    gate.touch()
    assert _poll(stopped) == "StreamCancelled"  # the handler saw the stop
    _plain_request_served(server)  # the single worker is free again


def test_error_mid_stream_is_the_last_chunk(server: LiveServer, tmp_path: Path) -> None:
    body = {"parts": ["one,"], "then_raise": True}
    with _stream(server, body) as response:
        assert response.status_code == 200  # the first part decided the status
        content = b"".join(response.iter_raw())
    assert content.startswith(b"one,")
    error = json.loads(content[len(b"one,") :])
    assert error["code"] == 500 and error["type"] == "ValueError"
    assert "Traceback" not in error["message"] and "/" not in error["message"]
    _plain_request_served(server)


def test_generator_items_are_parts(server: LiveServer, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    with _stream(server, {"yield": ["a", "b", "c"], "gate": str(gate)}) as response:
        assert response.headers["transfer-encoding"] == "chunked"
        first, chunks = _first_chunk(response)
        assert first == b"a"
        assert not gate.exists()
        gate.touch()
        assert b"".join(chunks) == b"bc"


def test_generator_error_mid_stream(server: LiveServer) -> None:
    with _stream(server, {"yield": ["a", "b"], "fail_after": 1}) as response:
        content = b"".join(response.iter_raw())
    assert content.startswith(b"a")
    assert json.loads(content[1:])["type"] == "RuntimeError"
    _plain_request_served(server)


def test_generate_joins_the_parts(server: LiveServer) -> None:
    answer = httpx.post(
        f"{server.url}/v2/models/stream/generate", json={"text_input": "hello big world"}
    )
    assert answer.status_code == 200
    assert answer.json() == {
        "model_name": "stream",
        "model_version": "1.0",
        "text_output": "hello big world",
    }
    versioned = httpx.post(
        f"{server.url}/v2/models/stream/versions/1.0/generate", json={"text_input": "a b"}
    )
    assert versioned.json()["text_output"] == "a b"
    # curl -d sends a form content type: the generate body is JSON all the same
    curl = httpx.post(
        f"{server.url}/v2/models/stream/generate",
        content=b'{"text_input": "c d"}',
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert curl.status_code == 200 and curl.json()["text_output"] == "c d"


def test_generate_stream_sends_server_sent_events(server: LiveServer) -> None:
    body = {"text_input": "hello big world"}
    with _stream(server, body, "/v2/models/stream/generate_stream") as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        text = response.read().decode()
    events = [json.loads(block.removeprefix("data: ")) for block in text.split("\n\n") if block]
    assert [e["text_output"] for e in events] == ["hello ", "big ", "world"]
    assert all(e["model_name"] == "stream" and e["model_version"] == "1.0" for e in events)


def test_generate_stream_client_leaving_closes_the_generator(
    server: LiveServer, tmp_path: Path
) -> None:
    gate, closed = tmp_path / "gate", tmp_path / "closed"
    body = {"yield": ["a", "b", "c"], "gate": str(gate), "closed": str(closed)}
    with _stream(server, body, "/v2/models/stream/generate_stream") as response:
        first, _ = _first_chunk(response)
        assert json.loads(first.removeprefix(b"data: "))["text_output"] == "a"
    gate.touch()  # the client is gone before the generator is advanced again
    assert _poll(closed) == "GeneratorExit"
    _plain_request_served(server)


def test_generate_stream_error_mid_stream_is_an_error_event(server: LiveServer) -> None:
    with _stream(
        server, {"yield": ["a", "b"], "fail_after": 1}, "/v2/models/stream/generate_stream"
    ) as response:
        text = response.read().decode()
    events = [json.loads(block.removeprefix("data: ")) for block in text.split("\n\n") if block]
    assert events[0]["text_output"] == "a"
    assert set(events[-1]) == {"error"} and "RuntimeError" in events[-1]["error"]


def test_generate_error_before_any_part_is_json(server: LiveServer) -> None:
    answer = httpx.post(
        f"{server.url}/v2/models/stream/generate_stream",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert answer.status_code == 400
    assert answer.headers["content-type"] == "application/json"
    assert set(answer.json()) == {"error"}
    missing = httpx.post(f"{server.url}/v2/models/nope/generate", json={"text_input": "x"})
    assert missing.status_code == 404 and set(missing.json()) == {"error"}


@pytest.mark.parametrize("path", ["generate", "generate_stream"])
def test_generate_body_must_be_a_json_object(server: LiveServer, path: str) -> None:
    # Triton refuses these; they reached the handler, which answered 200 to nothing
    for body in (b"", b"  ", b"[]", b"5", b'"text"', b"null"):
        answer = httpx.post(f"{server.url}/v2/models/stream/{path}", content=body)
        assert answer.status_code == 400, body
        assert answer.json() == {"error": "The generate request body must be a JSON object"}
    spaced = httpx.post(
        f"{server.url}/v2/models/stream/generate", content=b'\n {"text_input": "a"}'
    )
    assert spaced.status_code == 200 and spaced.json()["text_output"] == "a"


@pytest.mark.parametrize("path", ["generate", "generate_stream"])
def test_a_compressed_generate_body_must_be_a_json_object_too(
    server: LiveServer, path: str
) -> None:
    # A gzip or deflate body skipped the check: its broken JSON reached the handler raw (200)
    url = f"{server.url}/v2/models/stream/{path}"
    for body in (b"{not json", b"[1, 2]", b'{"text_input": "a"'):
        for coding, packed in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
            answer = httpx.post(url, content=packed, headers={"content-encoding": coding})
            assert answer.status_code == 400, (body, coding)
            assert answer.json() == {"error": "The generate request body must be a JSON object"}
    good = gzip.compress(b'{"text_input": "a b"}')
    answer = httpx.post(url, content=good, headers={"content-encoding": "gzip"})
    assert answer.status_code == 200 and "a " in answer.text


def test_a_large_generate_body_does_not_hold_the_event_loop(server: LiveServer) -> None:
    """The generate route parsed its JSON on the frontend's event loop: a body of
    max_request_size (6.5 MB of small arrays) held every other request for the whole parse,
    most of the call (half of it: the worker parses it too). Now /v2/health/live is answered
    all along: its longest wait was 0.3% of the call here, against 53% with the parse put back."""
    body = b'{"a": [' + b",".join([b"[]"] * 2_000_000) + b"]}"
    url = f"{server.url}/v2/models/stream/generate"
    answer, longest, took = longest_gap(
        f"{server.url}/v2/health/live", lambda: httpx.post(url, content=body, timeout=120)
    )
    assert answer.status_code == 200 and answer.json()["plain"] is True
    assert longest < took / 4, (longest, took)


def test_a_kserve_v1_instance_of_a_streaming_handler_is_all_its_parts(server: LiveServer) -> None:
    # Each instance's parts and final response, joined; only the final response was kept (a
    # generator's: "", every part lost)
    url = f"{server.url}/v1/models/stream:predict"
    instances = [{"yield": ["a", "b", "c"]}, {"parts": ["x", "y"]}, {"x": 1}]
    answer = httpx.post(url, json={"instances": instances}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"predictions": ["abc", "xyend", {"plain": True}]}
    failing = {"instances": [{"yield": ["a", "b"], "fail_after": 1}]}
    failed = httpx.post(url, json=failing, timeout=60)
    assert failed.status_code == 500 and "RuntimeError" in failed.json()["message"]
    _plain_request_served(server)


def test_a_kserve_v1_client_leaving_mid_stream_stops_the_handler(
    server: LiveServer, tmp_path: Path
) -> None:
    stopped = tmp_path / "stopped"
    url = f"{server.url}/v1/models/stream:predict"
    with pytest.raises(httpx.ReadTimeout):  # the stream never ends: the client gives up
        instance = {"until_stopped": str(stopped), "size": 1}  # (not all strings: JSON)
        httpx.post(url, json={"instances": [instance]}, timeout=1)
    assert _poll(stopped) == "StreamCancelled"
    _plain_request_served(server)


def test_response_timeout_bounds_each_part_not_the_stream(server: LiveServer) -> None:
    # 16 parts 0.25 s apart: 4 s in all, past the model's 3 s responseTimeout
    items = [str(i) for i in range(16)]
    with _stream(server, {"yield": items, "pace": 0.25}, "/predictions/paced") as response:
        assert response.status_code == 200
        assert response.read() == "".join(items).encode()


def test_streams_of_one_batch_are_answered_side_by_side(server: LiveServer) -> None:
    async def one(client: httpx.AsyncClient, name: str) -> list[bytes]:
        body = {"yield": [f"{name}1,", f"{name}2,"], "batch": True}
        async with client.stream("POST", "/predictions/batched", json=body) as response:
            assert response.headers["transfer-encoding"] == "chunked"
            return [chunk async for chunk in response.aiter_raw() if chunk]

    async def both() -> tuple[list[bytes], list[bytes]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            return tuple(await asyncio.gather(one(client, "a"), one(client, "b")))  # type: ignore[return-value]

    a, b = asyncio.run(both())
    assert b"".join(a) == b"a1,/2a2,/2"  # both ran in one batch of 2, each got its own parts
    assert b"".join(b) == b"b1,/2b2,/2"


def test_worker_death_mid_stream_is_the_last_chunk(server: LiveServer) -> None:
    with _stream(server, {"parts": ["one,", "two,"], "crash": True}, "/predictions/paced") as r:
        assert r.status_code == 200
        content = r.read()
    assert content.startswith(b"one,")
    error = json.loads(content[len(b"one,") :])
    assert error["code"] == 503 and error["type"] == "WorkerDied"


def test_model_version_stream_yields_parts_then_the_final_response(server: LiveServer) -> None:
    """The API other listeners (gRPC) use, called on the live server's own loop."""
    registry, loop = server.server.registry, server.server._loop
    assert registry is not None and loop is not None
    mv = registry.resolve("stream", None)

    async def collect(body: dict[str, Any]) -> list[p.WireResponse]:
        wire = p.WireRequest(f"api-{len(body)}", json.dumps(body).encode(), "application/json")
        return [response async for response in mv.stream(wire)]

    def run(body: dict[str, Any]) -> list[tuple[bool, bytes]]:
        answers = asyncio.run_coroutine_threadsafe(collect(body), loop).result(60)
        return [(r.partial, r.body) for r in answers]

    assert run({"x": 1}) == [(False, b'{"plain":true}')]  # nothing streamed: one response
    assert run({"parts": ["a", "b"]}) == [(True, b"a"), (True, b"b"), (False, b"end")]
    assert run({"yield": ["x", "y"]}) == [(True, b"x"), (True, b"y")]  # empty end not yielded


def _requests_counted(server: LiveServer, model: str) -> float:
    text = httpx.get(f"{server.metrics_url}/metrics", timeout=30).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "torchbay_requests_total" and sample.labels.get("model") == model
    )


def test_a_stream_is_one_request_in_the_metrics(server: LiveServer) -> None:
    before = _requests_counted(server, "stream")
    with _stream(server, {"parts": ["a", "b", "c"]}) as response:
        assert response.read() == b"abcend"
    end = time.monotonic() + 30  # recorded when the stream ended: poll, never sleep a guess
    while (counted := _requests_counted(server, "stream")) == before and time.monotonic() < end:
        time.sleep(0.05)
    assert counted == before + 1  # once, not once per part


def test_a_part_past_max_response_size_fails_the_request_and_stops_the_handler(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    store = build_store(
        tmp_path_factory, "stream-limit", {"stream": str(ASSETS / "stream_handler.py")}
    )
    config = make_config(store, load_models=["stream.mar"], max_response_size=1000)
    live = LiveServer(config).start()
    try:
        stopped = tmp_path / "stopped"
        answer = httpx.post(
            f"{live.url}/predictions/stream",
            json={"until_stopped": str(stopped), "size": 2000},
            timeout=60,
        )
        assert answer.status_code == 500  # before any part went out: a plain error answer
        assert "max_response_size" in answer.json()["message"]
        assert _poll(stopped) == "StreamCancelled"  # the worker was told to stop producing
        _plain_request_served(live)
    finally:
        live.stop()


def test_client_leaving_with_a_request_pipelined_behind_the_stream_closes_it(
    server: LiveServer, tmp_path: Path
) -> None:
    """uvicorn tells only the connection's last request read (here the pipelined one, never
    started) that the client left: the stream being answered must be told too."""
    closed = tmp_path / "closed"

    def request(body: dict[str, Any]) -> bytes:
        data = json.dumps(body).encode()
        head = f"POST /predictions/stream HTTP/1.1\r\nhost: x\r\ncontent-length: {len(data)}\r\n"
        return head.encode() + b"content-type: application/json\r\n\r\n" + data

    port = server.server.state.ports.inference
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        # One write: the server reads the second request, pipelined, with the first.
        sock.sendall(request({"yield": ["a"], "closed": str(closed)}) + request({"x": 1}))
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")  # the stream is under way
    assert _poll(closed, 30) == "GeneratorExit"  # not left to run to its end for nobody
    _plain_request_served(server)


@pytest.mark.parametrize(
    ("path", "body", "expected"),
    [
        ("/predictions/stream", {"yield": ["a", "b"]}, b"ab"),
        (
            "/v2/models/stream/generate_stream",
            {"text_input": "a b"},
            b'data: {"model_name":"stream","model_version":"1.0","text_output":"a "}\n\n'
            b'data: {"model_name":"stream","model_version":"1.0","text_output":"b"}\n\n',
        ),
    ],
)
def test_an_http_1_0_client_gets_the_stream_whole_not_chunked(
    server: LiveServer, path: str, body: dict[str, Any], expected: bytes
) -> None:
    """RFC 9112 6.1: no Transfer-Encoding to an HTTP/1.0 request (it would read the chunk
    framing as the body); the stream is answered whole, with its length."""
    data = json.dumps(body).encode()
    request = f"POST {path} HTTP/1.0\r\ncontent-length: {len(data)}\r\n\r\n".encode() + data
    with socket.create_connection(("127.0.0.1", server.server.state.ports.inference), 60) as sock:
        sock.sendall(request)
        answer = b"".join(iter(lambda: sock.recv(65536), b""))  # HTTP/1.0: closed at its end
    head, _, content = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert b"transfer-encoding" not in head.lower()
    assert f"content-length: {len(expected)}".encode() in head.lower()
    assert content == expected
