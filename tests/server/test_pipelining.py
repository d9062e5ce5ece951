"""The pipelining bound's feeding (server/http/pipelining.py): a read is parsed a step at a time
between requests, but the rest of a body in one go. In steps, a 16 MiB upload cost ~7% more
(uvicorn joins each step's bytes to the body read so far); the live bound on pipelined requests
is tested in test_http_limits."""

from __future__ import annotations

from types import SimpleNamespace

from torchbay.server.http.pipelining import FEED_STEP, BoundedPipeline


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
