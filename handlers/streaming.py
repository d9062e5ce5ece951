"""Streaming responses from a handler, torch-free: what a handler calls. The worker's side (the
parts' sink, a run's stream, driving generators) is ``runtime/streams.py``.

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

from typing import Any, Protocol


class StreamCancelled(Exception):
    """The clients of every request a part was being sent for have gone away."""


class Stream(Protocol):
    """What ``context.stream`` holds during a handler run (the runtime's ``RunStream``)."""

    def send(self, ret: Any, req_id_map: dict[int, str]) -> None: ...


def send_intermediate_predict_response(
    ret: Any, req_id_map: dict[int, str], message: str = "", code: int = 200, context: Any = None
) -> None:
    """TorchServe's ``ts.protocol.otf_message_handler.send_intermediate_predict_response``."""
    stream: Stream | None = getattr(context, "stream", None)
    if stream is None or not callable(getattr(stream, "send", None)):
        raise RuntimeError("send_intermediate_predict_response needs the handler's context")
    stream.send(ret, req_id_map)
