"""The pipelining bound's feeding (server/http/pipelining.py): a read is parsed a step at a time
between requests, but the rest of a body in one go. In steps, a 16 MiB upload cost ~7% more
(uvicorn joins each step's bytes to the body read so far); the live bound on pipelined requests
is tested in test_http_limits. And reading, paused for a large body, goes on once the body is
whole (the real protocol over a transport that records it: the socket is the seam)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from torchbay.server.http.pipelining import FEED_STEP, BoundedPipeline

from .http_seam import connected


class _Fed(BoundedPipeline):
    """The mixin with the protocol's parts it reads: what ``_feed`` got, in order."""

    def __init__(self, cycle: object | None) -> None:
        self.cycle, self.pipeline, self.fed = cycle, [], []
        self.flow = SimpleNamespace(pause_reading=lambda: None)

    def _feed(self, data: bytes | memoryview) -> bool:
        self.fed.append(len(data))
        return True


def test_the_rest_of_a_body_is_fed_whole() -> None:
    read = memoryview(bytes(256 << 10))
    reading = _Fed(SimpleNamespace(more_body=True))
    reading._feed_bounded(read)
    assert reading.fed == [256 << 10]


def test_between_requests_a_read_is_fed_in_steps() -> None:
    read = memoryview(bytes(4 * FEED_STEP))
    done = _Fed(SimpleNamespace(more_body=False))  # the last request is whole
    done._feed_bounded(read)
    assert done.fed == [FEED_STEP] * 4
    first = _Fed(None)  # no request yet
    first._feed_bounded(read)
    assert first.fed == [FEED_STEP] * 4


def test_with_requests_waiting_a_body_is_fed_in_steps_too() -> None:
    read = memoryview(bytes(2 * FEED_STEP))
    waiting = _Fed(SimpleNamespace(more_body=True))
    waiting.pipeline.append(object())  # one request waits behind the one answered
    waiting._feed_bounded(read)
    assert waiting.fed == [FEED_STEP, FEED_STEP]


HEAD = b"POST /x HTTP/1.1\r\nHost: a\r\ncontent-length: 200000\r\n\r\n"


async def _reading_once_taken(then: bytes) -> bool:
    """Whether the connection reads once an app that waits for its answer has taken the body
    of a request whose head was read first (the app waits for its body) and then ``then``, in
    one read (its 200 KB body, and whatever follows)."""
    started, taken, answer = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        started.set()
        while (await receive()).get("more_body"):
            pass
        taken.set()
        await answer.wait()
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    protocol, transport = connected(app)
    protocol.data_received(HEAD)
    await asyncio.wait_for(started.wait(), 5)
    await asyncio.sleep(0)  # the app waits in receive(), reading on
    protocol.data_received(then)
    await asyncio.wait_for(taken.wait(), 5)
    reading = transport.reading
    answer.set()
    protocol.connection_lost(None)
    await asyncio.sleep(0)
    return reading


def test_reading_goes_on_once_a_large_body_is_taken() -> None:
    """uvicorn pauses reading while more than 64 KiB of body waits for the app and resumed only
    when the app asked for more: once the app had it all, reading stayed paused and a client
    that then left went unseen while its request waited (it ran for nobody, recorded 200)."""
    assert asyncio.run(_reading_once_taken(bytes(200_000)))


def test_a_pipelined_request_behind_it_still_pauses_reading() -> None:
    pipelined = b"GET /y HTTP/1.1\r\nHost: a\r\n\r\n"
    assert not asyncio.run(_reading_once_taken(bytes(200_000) + pipelined))
