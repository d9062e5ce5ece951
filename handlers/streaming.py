"""Streaming responses from a handler, torch-free.

Two ways for a handler to stream, both ending as ``Part`` frames to the frontend (the worker's
``PartSink``) while the batch runs; the batch's final result ends every request's stream:

* TorchServe's ``send_intermediate_predict_response(ret, req_id_map, message, code, context)``
  (``from ts.protocol.otf_message_handler import ...``, or ``ts.handler_utils.utils``: torchbay
  aliases both here). Each call sends one part per request of ``req_id_map`` (index -> request
  id, as ``context.request_ids``):
  ``ret[idx]``, encoded as a final result is (bytes as is, str as UTF-8, anything else as JSON),
  with the status, content type and headers set on the context for ``idx``. ``message`` and
  ``code`` are accepted for compatibility and unused (TorchServe takes each request's status from
  the context too). The handler's return value is the last part.
* A handler whose ``handle`` returns a *generator* (any iterator that is not a list, str, bytes
  or dict) for a request: every item it yields is one part of that request, and the request's
  final response is empty (``b""``): the stream ends when the generator does. The generators of
  one batch are advanced in turn, one item each, so no request of the batch waits for another's
  whole stream. (A ``BaseHandler`` subclass whose ``inference`` returns generators must pass them
  through its ``postprocess``.)

Cancellation (the frontend's ``Cancel``, when a client went away): the next
``send_intermediate_predict_response`` skips the cancelled requests and, when every request it
was given is cancelled, raises :class:`StreamCancelled` (the handler sees the stop; letting it
propagate ends the batch). A generator of a cancelled request is closed (``GeneratorExit`` at its
``yield``) before it is advanced again. Either way the worker is free once the handler returns.

Batches (``batch_size`` > 1): each request's parts go out as they are produced, but every
request's final response travels in the batch's one result, when the handler returns: a request
whose stream (or generator) ended early, or that does not stream, is answered when the batch's
longest stream ends.

Errors mid-stream: once a run of the handler sent a part, it is never run again on part of the
batch (the Service's bisecting would send those parts twice): an exception then answers every
request of that run with its error, which its client receives as the stream's last part.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from .responses import Response, error_response

logger = logging.getLogger(__name__)

CANCELLED_STATUS = 499  # nginx's "client closed request": nobody reads it, the client is gone


class StreamCancelled(Exception):
    """The clients of every request a part was being sent for have gone away."""

    @staticmethod
    def response(request_id: str, v2: bool) -> Response:
        return cancelled_response(request_id, v2)


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

    def cancelled(self, idx: int) -> bool:
        return self.sink.cancelled(self.request_ids[idx])

    def send(self, ret: Any, req_id_map: dict[int, str]) -> None:
        live = 0
        for idx, request_id in dict(req_id_map).items():
            if self.sink.cancelled(request_id):
                continue
            live += 1
            self.sink.send(request_id, self.encode(idx, ret[idx]))
            self.sent += 1
        if not live:
            raise StreamCancelled("the client went away; stop producing")


def send_intermediate_predict_response(
    ret: Any, req_id_map: dict[int, str], message: str = "", code: int = 200, context: Any = None
) -> None:
    """TorchServe's ``ts.protocol.otf_message_handler.send_intermediate_predict_response``."""
    stream = getattr(context, "stream", None)
    if not isinstance(stream, RunStream):
        raise RuntimeError("send_intermediate_predict_response needs the handler's context")
    stream.send(ret, req_id_map)


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
    except Exception as exc:  # a handler error mid-stream answers this request alone
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
        except Exception as exc:  # the generator raised while being closed
            return fail(idx, exc)
    logger.info("request %s: the client went away; its stream stopped", request_id)
    return cancelled_response(request_id, v2)
