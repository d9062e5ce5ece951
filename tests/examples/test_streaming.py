"""examples/streaming: a text generator streaming token by token, as chunked HTTP and as
server-sent events (the generate extension), from the real server."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from .conftest import example_module

pytestmark = pytest.mark.slow


def test_generator_streams_tokens(serve, tmp_path: Path) -> None:
    build = example_module("streaming")
    mar = Path(build.build(tmp_path / "out"))
    server = serve(mar.parent, load_models=["zen.mar"])
    expected = build.generate("Errors should", 10)
    assert expected.startswith(" be a bad idea")

    body = {"prompt": "Errors should", "max_new_tokens": 10}
    with httpx.stream("POST", f"{server.url}/predictions/zen", json=body, timeout=60) as reply:
        assert reply.status_code == 200
        assert reply.headers["transfer-encoding"] == "chunked"
        text = b"".join(reply.iter_raw()).decode()
    assert text == expected

    # The generate extension: one server-sent event per token, in order.
    sse = {"text_input": "Errors should", "parameters": {"max_new_tokens": 10}}
    url = f"{server.url}/v2/models/zen/generate_stream"
    with httpx.stream("POST", url, json=sse, timeout=60) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        raw = reply.read().decode()
    events = [json.loads(b.removeprefix("data: ")) for b in raw.split("\n\n") if b]
    assert len(events) == 10
    assert "".join(e["text_output"] for e in events) == expected

    bad = httpx.post(f"{server.url}/predictions/zen", json={"prompt": "x", "max_new_tokens": 0})
    assert bad.status_code == 400 and "max_new_tokens" in bad.json()["message"]
