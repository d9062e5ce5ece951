"""The worker's side of streaming (see ``handlers/streaming.py`` for what a handler calls): where
parts go (``PartSink``), one handler run's parts (``RunStream``, bound to ``context.stream``), and
driving the generators a handler returned, one item of each in turn. Torch-free.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from ..errors import handler_fault
from ..streaming import StreamCancelled
from .responses import Response, error_response

logger = logging.getLogger(__name__)

CANCELLED_STATUS = 499  # nginx's "client closed request": nobody reads it, the client is gone


class PartSink(Protocol):
    """Where parts go (the worker's socket) and which requests were cancelled."""

    def send(self, request_id: str, response: Response) -> None: ...

    def cancelled(self, request_id: str) -> bool: ...


class NullSink:
    """No frontend (``torchbay verify``, tests): parts are dropped, nothing is ever cancelled."""

    def send(self, request_id: str, response: Response) -> None:
        logger.debug("request %s: a streamed part dropped (no frontend)", request_id)

    def cancelled(self, request_id: str) -> bool:
        return False


AFTER_RUN = "send_intermediate_predict_response after the handler returned"


class RunStream:
    """The parts of one handler run; the Service binds it to ``context.stream`` for the run.

    ``encode(idx, item)`` turns one result of the run into its Response (the Service's own
    encoding, with the context's status and headers for ``idx``).
    """

    def __init__(
        self, sink: PartSink, request_ids: list[str], encode: Callable[[int, Any], Response]
    ) -> None:
        self.sink = sink
        self.request_ids = request_ids
        self.encode = encode
        self.sent = 0  # parts sent in this run: the run must not be retried
        self.ended = False  # the run returned: its requests are answered, no part may follow

    def end(self) -> None:
        """The run returned: no part may follow, and its requests are let go (``context.stream``
        holds this stream until the next run; a client's CUDA shared memory must not stay
        mapped that long)."""
        self.ended = True
        self.encode = _ended

    def cancelled(self, idx: int) -> bool:
        return self.sink.cancelled(self.request_ids[idx])

    def send(self, ret: Any, req_id_map: dict[int, str]) -> None:
        if self.ended:  # e.g. from a thread the handler left running
            raise RuntimeError(AFTER_RUN)
        live = 0
        for idx, request_id in dict(req_id_map).items():
            if self.sink.cancelled(request_id):
                continue
            live += 1
            self.sink.send(request_id, self.encode(idx, ret[idx]))
            self.sent += 1
        if not live:
            raise StreamCancelled("the client went away; stop producing")


def _ended(idx: int, item: Any) -> Response:
    raise RuntimeError(AFTER_RUN)


def is_generator(item: Any) -> bool:
    """A result that streams: an iterator that is not a value a handler returns whole."""
    return isinstance(item, Iterator) and not isinstance(item, (str, bytes, bytearray, dict))


def streams(results: Any, n: int) -> bool:
    """The handler returned a generator for some of its ``n`` requests."""
    return isinstance(results, list) and len(results) == n and any(map(is_generator, results))


def cancelled_response(request_id: str, v2: bool) -> Response:
    message = f"the client went away; request id {request_id}"
    return error_response(CANCELLED_STATUS, "StreamCancelled", message, v2)


def drive_generators(
    results: list[Any],
    stream: RunStream,
    fail: Callable[[int, BaseException], Response],
    v2: list[bool],
) -> dict[int, Response]:
    """Run the generators among ``results`` to their end, one item of each in turn, each item a
    part; the final Response of each (empty, or its error or cancellation), by index."""
    active = {i: item for i, item in enumerate(results) if is_generator(item)}
    finals: dict[int, Response] = {}
    while active:
        for idx, gen in list(active.items()):
            request_id = stream.request_ids[idx]
            if stream.cancelled(idx):
                finals[idx] = _close(gen, request_id, v2[idx], fail, idx)
            else:
                final = _advance(gen, idx, stream, fail)
                if final is None:
                    continue
                finals[idx] = final
            del active[idx]
    return finals


def _advance(
    gen: Iterator[Any], idx: int, stream: RunStream, fail: Callable[[int, BaseException], Response]
) -> Response | None:
    """Send the generator's next item as a part; its final Response once it ends (or fails)."""
    try:
        item = next(gen)
    except StopIteration:
        return Response(200, b"", "application/octet-stream", {})
    except BaseException as exc:  # a handler error mid-stream answers this request alone
        if not handler_fault(exc):
            raise
        return fail(idx, exc)
    stream.sink.send(stream.request_ids[idx], stream.encode(idx, item))
    stream.sent += 1
    return None


def _close(
    gen: Iterator[Any],
    request_id: str,
    v2: bool,
    fail: Callable[[int, BaseException], Response],
    idx: int,
) -> Response:
    close = getattr(gen, "close", None)
    if callable(close):
        try:
            close()
        except BaseException as exc:  # the generator raised while being closed
            if not handler_fault(exc):
                raise
            return fail(idx, exc)
    logger.info("request %s: the client went away; its stream stopped", request_id)
    return cancelled_response(request_id, v2)
