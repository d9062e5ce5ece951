"""Pipelined HTTP/1.1 requests, parsed no further ahead than ``MAX_PIPELINED`` requests behind the
one being answered (:class:`BoundedPipeline`, mixed into ``limits.LimitedHttpToolsProtocol``).

httptools parses a whole read at once, and uvicorn queues every request it finds behind the one
being answered and resumes reading after every answer: each answer let the next read in, so a
client that pipelined small requests faster than they were answered (or never read the answers)
had the server hold every one of them, about 1.5 KB each (12 MB of requests pipelined without
reading the answers: 500 MB). Here a read is parsed a step at a time while fewer than
``MAX_PIPELINED`` requests wait; the rest of it is held, reading paused, until they are fewer.
A connection then holds at most ``MAX_PIPELINED`` plus one step's requests, and one read.
"""

from __future__ import annotations

from typing import Any

# Requests parsed and waiting behind the one being answered before the rest of a read waits
# too, and the bytes parsed at a time past a read of this size.
MAX_PIPELINED = 32
FEED_STEP = 8 << 10


class BoundedPipeline:
    """The held part of a read and its feeding; the protocol's ``_feed(data) -> bool`` parses
    (False: the connection is answered or closing)."""

    _held: memoryview | None = None  # read but not yet parsed
    _feeding = False  # _feed_held is scheduled
    pipeline: Any
    cycle: Any
    flow: Any
    loop: Any
    transport: Any

    def _feed(self, data: bytes | memoryview) -> bool:  # pragma: no cover - the protocol's
        raise NotImplementedError

    def _feed_bounded(self, data: memoryview) -> None:
        """Feed ``data`` a step at a time while fewer than ``MAX_PIPELINED`` requests wait behind
        the one answered, and hold the rest (reading paused) until they are fewer: httptools
        parses a whole read at once, thousands of small pipelined requests, and uvicorn resumes
        reading after every answer (a client that pipelined 12 MB without reading the answers
        made the server hold 500 MB of waiting requests)."""
        for start in range(0, len(data), FEED_STEP):
            if len(self.pipeline) >= MAX_PIPELINED:
                self._held = data[start:]
                self.flow.pause_reading()
                return
            if self._mid_body():  # the rest of a body in one go (below)
                self._feed(data[start:])
                return
            if not self._feed(data[start : start + FEED_STEP]):
                return

    def _mid_body(self) -> bool:
        """Whether the request being read is in its body with no other request waiting: then
        the rest of a read is fed whole, as uvicorn feeds it. A large body fed in steps cost a
        16 MiB upload ~7% more (uvicorn joins each step's bytes to the body read so far)."""
        cycle = self.cycle
        return cycle is not None and cycle.more_body and not self.pipeline

    def on_message_complete(self) -> None:
        """A request's body is whole: reading resumes unless pipelining paused it. uvicorn
        pauses reading while more than 64 KiB of body waits for the app (``on_body``) and
        resumes when the app asks for more; a body whose last read passed 64 KiB left reading
        paused once the app took it, so a client that then left went unnoticed while its
        request waited (no ``connection_lost``: the worker ran for nobody, 200 recorded instead
        of 499). Nothing more of this body can come; what does is a pipelined request, which
        pauses reading again (``on_headers_complete``) and is bounded here."""
        super().on_message_complete()
        flow = self.flow
        paused_for_body = flow.read_paused and self._held is None and not self.pipeline
        if paused_for_body and not self.transport.is_closing():
            flow.resume_reading()

    def on_response_complete(self) -> None:
        if self._held is None:
            super().on_response_complete()  # the next pipelined request starts; reading resumes
            return
        flow = self.flow  # reading stays paused: the held bytes are parsed first
        flow.read_paused = False  # (uvicorn's resume is then a no-op)
        try:
            super().on_response_complete()
        finally:
            flow.read_paused = True
        short = len(self.pipeline) < MAX_PIPELINED
        if short and not self._feeding and not self.transport.is_closing():
            self._feeding = True
            self.loop.call_soon(self._feed_held)

    def _feed_held(self) -> None:
        self._feeding = False
        held, self._held = self._held, None
        if held is not None and not self.transport.is_closing():
            self.flow.resume_reading()
            self._feed_bounded(held)
