"""HTTP/1.1 edge limits for every listener: uvicorn's httptools protocol plus nginx's timeouts.

uvicorn (httptools) cancels its keep-alive timer on the first byte of a request and has no limit
on header size, so a client that never finishes its headers, or declares a body and stops
sending it, holds a connection forever. :class:`LimitedHttpToolsProtocol` adds, per connection:

* a header deadline (nginx ``client_header_timeout``), from the connection's opening for its
  first request and from the first byte of each later one, until the headers are complete. Past
  it: ``408`` and close (a connection that sent nothing at all is just closed);
* a body deadline (nginx ``client_body_timeout``): the longest gap between two reads while the
  body is incomplete (not counted while we, not the client, hold reading paused). Past it: ``408``
  and close; the ASGI app's ``receive()`` answers ``http.disconnect`` and whatever it sends
  afterwards is dropped, so the request never runs;
* ``max_header_size`` (request line + headers) and ``max_header_count``: ``431`` and close;
* a transfer coding other than ``chunked`` (``gzip, chunked``): ``501`` and close, as nginx
  (httptools would read the body as chunked and hand it on still gzipped, as the body);
* ``max_connections`` open connections on the listener: past it, ``503`` and close at once, so
  one listener's clients cannot take every file descriptor (``edge_rules.connection_cap``);
* at most ``pipelining.MAX_PIPELINED`` pipelined requests parsed ahead (``BoundedPipeline``).

A listener may answer a request from its headers alone, before any ASGI task exists (the
inference listener's refusals under overload, server.http.early).

Idle keep-alive between requests stays uvicorn's ``timeout_keep_alive``. Error bodies are the
server's ``{"code", "type", "message"}`` JSON (OIP's ``{"error"}`` for a ``/v2`` target) with
``connection: close``, then a lingering close (half-close, discard the rest of the upload for up
to ``LINGER_S``) so a client mid-upload reads
the answer rather than a reset. A refusal while an earlier pipelined response is still being
written just closes the connection after that response.

The hot path stays cheap: the deadlines share one lazy timer per connection that fires at or
before the earliest deadline and re-arms itself if the deadline moved, so a busy keep-alive
connection allocates a timer handle about once per header timeout, not per request; per request
the cost is a clock read and a few integer updates per header.
"""

from __future__ import annotations

import logging
from asyncio import TimerHandle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from torchbay.server.http import edge_rules
from torchbay.server.http.coalesce import CoalescingCycle
from torchbay.server.http.disconnect import client_left
from torchbay.server.http.pipelining import FEED_STEP, BoundedPipeline

log = logging.getLogger("torchbay.http")

_IDLE, _HEADERS, _BODY, _CLOSING, _FULL = 0, 1, 2, 3, 4
LINGER_S = 2.0  # the lingering close after an error answer (see the module docstring)
FULL_WAIT_S = 1.0  # a connection past the cap waits this long at most for its request's bytes
_FULL_LOG_S = 10.0  # a listener that refuses connections says so at most this often


@dataclass(frozen=True)
class HttpLimits:
    header_timeout_s: float = 30.0
    body_timeout_s: float = 60.0
    max_header_size: int = 64 << 10
    max_header_count: int = 256
    max_connections: int = 0  # per listener; 0: no cap

    @classmethod
    def from_config(cls, config: Any, listeners: int = 3) -> HttpLimits:
        """The limits of a ``ServerConfig`` whose ``listeners`` HTTP listeners share the
        process's file descriptors."""
        return cls(
            header_timeout_s=config.http_header_timeout_s,
            body_timeout_s=config.http_body_timeout_s,
            max_header_size=config.max_header_size,
            max_header_count=config.max_header_count,
            max_connections=config.max_connections or edge_rules.connection_cap(listeners),
        )


# A listener's whole answer from a request's headers (InferenceApp.at_headers), or None.
AtHeaders = Callable[[dict[str, Any]], "tuple[int, list[tuple[bytes, bytes]], bytes] | None"]


class _Refused(Exception):
    """Raised from a parser callback to stop parsing; ``_rejection`` says what to answer."""


class LimitedHttpToolsProtocol(BoundedPipeline, HttpToolsProtocol):
    """uvicorn's httptools protocol with header/body timeouts and header limits."""

    limits: HttpLimits = HttpLimits()  # set per listener by protocol_class()
    url = b""  # the request target, uvicorn's (set per request; none before the first)
    _max_size = limits.max_header_size  # the two checked per header, as plain class attributes
    _max_count = limits.max_header_count

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # One lazy timer per connection (the module docstring's "hot path").
        self._timer: TimerHandle | None = None
        self._timer_at = 0.0
        self._phase = _IDLE
        self._begun = False  # a byte of a request arrived on this connection
        self._header_due = 0.0  # loop time the current headers must be complete by; 0: none
        self._close_due = 0.0  # while closing: loop time of the forced close; 0: none
        self._raw = 0  # bytes read while the current headers were incomplete (a coarse bound)
        self._size = 0  # request line + header bytes, exact
        self._count = 0
        self._last_read = 0.0
        self._rejection: tuple[int, str] | None = None
        # The cycle whose ASGI task was started last: the one being answered, which is not
        # ``self.cycle`` once a pipelined request's headers have arrived behind it.
        self._answering: RequestResponseCycle | None = None

    # -- connection -----------------------------------------------------------------------------

    _full_logged = 0.0  # loop time this listener last logged refusing connections

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        cap = self.limits.max_connections
        if cap and len(self.connections) > cap:
            self._full(cap)
            return
        self._phase = _HEADERS  # the first request is due within the header timeout
        self._header_due = self.loop.time() + self.limits.header_timeout_s
        self._ensure_timer(self._header_due)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        answering, self._answering = self._answering, None
        if answering is not None and answering is not self.cycle:
            # uvicorn tells only ``self.cycle``, the last request read: here a pipelined one
            # that never started. The request being answered (still waiting, or streaming)
            # is told too, so that it stops rather than runs for nobody.
            if not answering.response_complete:
                answering.disconnected = True
            answering.message_event.set()
            client_left(answering)
        client_left(self.cycle)  # a request waiting for its answer is cancelled
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._phase >= _CLOSING:
            if self._phase == _FULL:
                self._refuse_connection()
            return  # answered and closing: discard
        if self._held is not None:  # a read already under way when reading paused
            self._held = memoryview(bytes(self._held) + data)
            return
        self._unset_keepalive_if_required()
        self._last_read = self.loop.time()
        if len(data) <= FEED_STEP and not self.pipeline:
            self._feed(data)
        else:
            self._feed_bounded(memoryview(data))

    def _feed(self, data: bytes | memoryview) -> bool:
        """Parse ``data``; False when the connection is answered or closing (held bytes fed
        after a refusal of a pipelined request are not parsed)."""
        if self._phase >= _CLOSING:
            return False
        if self._phase != _BODY:
            self._raw += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():  # pragma: no cover - our listeners serve no websockets
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return False
        except httptools.HttpParserError:
            rejection, self._rejection = self._rejection, None
            if rejection is not None:
                self._refuse_headers(*rejection)
                return False
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
            return False
        if self._phase == _HEADERS:
            if self._raw > self.limits.max_header_size:
                self._refuse_headers(431, self._too_large())
                return False
        elif self._phase == _BODY:
            self._ensure_timer(self._last_read + self.limits.body_timeout_s)
        return self._phase < _CLOSING

    # -- parser callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase, self._begun, self._size, self._count = _HEADERS, True, 0, 0
        if not self._header_due:  # not the connection's first request: due from its first byte
            self._header_due = self._last_read + self.limits.header_timeout_s
            self._ensure_timer(self._header_due)

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._size += len(url)
        if self._size > self._max_size:
            self._refuse(431, self._too_large())

    def on_header(self, name: bytes, value: bytes) -> None:
        count = self._count = self._count + 1
        size = self._size = self._size + len(name) + len(value) + 4
        if count > self._max_count or size > self._max_size:
            if count > self._max_count:
                self._refuse(431, f"more than {self._max_count} request headers")
            self._refuse(431, self._too_large())
        name = name.lower()  # uvicorn's on_header, inlined
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        elif name == b"transfer-encoding":
            unknown = edge_rules.unknown_transfer_coding(value)
            if unknown is not None:
                self._refuse(501, f"Transfer-Encoding {unknown!r} is not supported (only chunked)")
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._phase, self._header_due = _BODY, 0.0
        self._at_headers = True
        try:
            super().on_headers_complete()
        finally:
            self._at_headers = False
        # uvicorn made the cycle and created (not yet ran) its ASGI task: the task looks up
        # ``cycle.send`` when it first runs, so the swap is in time.
        if type(self.cycle) is RequestResponseCycle:
            self.cycle.__class__ = CoalescingCycle
            self.cycle.close_lingering = self._close_lingering

    def on_message_complete(self) -> None:
        self._phase, self._raw = _IDLE, 0
        super().on_message_complete()

    # -- answers from the headers ---------------------------------------------------------------

    at_headers: AtHeaders | None = None  # set per listener by protocol_class()
    _at_headers = False  # inside on_headers_complete (not a pipelined request's later start)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        """The listener's answer from the headers alone, if it has one, written before any ASGI
        task (a refusal under overload). Not for uvicorn's own 503 app, a connection closing or
        a client waiting for ``100 Continue`` (the ASGI path closes those properly), nor for a
        pipelined request started from its predecessor's send (not written yet: coalesce.py)."""
        early = self.at_headers if self._at_headers and app is self.app else None
        if early is not None and cycle.keep_alive and not cycle.waiting_for_100_continue:
            answer = early(cycle.scope)
            if answer is not None:
                self._answer(cycle, *answer)
                return
        self._answering = cycle
        super()._start_asgi_task(cycle, app)

    def _answer(self, cycle: RequestResponseCycle, status: int, headers: Any, body: bytes) -> None:
        """Write ``cycle``'s whole answer as uvicorn's ``send`` would; the rest of its body is
        discarded as it arrives (the cycle is complete)."""
        cycle.response_started = cycle.response_complete = True
        if not self.transport.is_closing():
            self.transport.write(
                edge_rules.answer_bytes(status, cycle.default_headers + headers, body)
            )
        cycle.on_response()  # keep-alive timer, or the next pipelined request

    # -- the timer ------------------------------------------------------------------------------

    def _ensure_timer(self, due: float) -> None:
        """Make the timer fire no later than ``due`` (loop time)."""
        timer = self._timer
        if timer is not None:
            if self._timer_at <= due:
                return
            timer.cancel()
        self._timer = self.loop.call_at(due, self._on_timer)
        self._timer_at = due

    def _on_timer(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        now, phase = self.loop.time(), self._phase
        if phase == _HEADERS:
            if now < self._header_due:
                self._ensure_timer(self._header_due)
            elif not self._begun:  # nothing of a request arrived: just close
                self.transport.close()
            elif self.flow.read_paused:  # we are the ones not reading (pipelined requests)
                self._ensure_timer(now + self.limits.header_timeout_s)
            else:
                limit = self.limits.header_timeout_s
                self._refuse_headers(408, f"the request headers did not arrive within {limit:g} s")
        elif phase == _BODY:
            due = self._last_read + self.limits.body_timeout_s
            if now < due:
                self._ensure_timer(due)
            elif self.flow.read_paused:  # we are the ones not reading: not the client's stall
                self._ensure_timer(now + self.limits.body_timeout_s)
            else:
                self._body_stalled()
        elif phase == _FULL:
            self.transport.close()  # past the cap and silent: just close
        elif phase == _CLOSING and self._close_due:
            if now < self._close_due:
                self._ensure_timer(self._close_due)
            else:
                self.transport.close()
        # _IDLE: nothing is due (between requests, uvicorn's keep-alive timer runs)

    def _body_stalled(self) -> None:
        limit = self.limits.body_timeout_s
        cycle = self.cycle
        if cycle is None or cycle.response_started or self.pipeline:
            self.transport.close()  # a response is under way: nothing to answer with
            return
        # The app's receive() now answers http.disconnect and its send() is dropped.
        cycle.disconnected = True
        cycle.message_event.set()
        self._send_error(408, f"the request body stalled for {limit:g} s")

    # -- refusals -------------------------------------------------------------------------------

    def _too_large(self) -> str:
        return f"the request line and headers exceed {self.limits.max_header_size} bytes"

    def _refuse(self, status: int, message: str) -> None:
        self._rejection = (status, message)
        raise _Refused(message)

    def _refuse_headers(self, status: int, message: str) -> None:
        """Refuse the request whose headers are being read."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # An earlier (pipelined) response is still being written: close after it, and
            # read nothing more.
            cycle.keep_alive = False
            self._phase = _CLOSING
            self.flow.pause_reading()
            return
        self._send_error(status, message)

    def _full(self, cap: int) -> None:
        """The listener holds ``cap`` connections: this one is answered 503 once its first bytes
        are read (closed unread, the answer would be lost to a reset), or closed after
        ``FULL_WAIT_S`` without any; never lingering, it must free its descriptor."""
        self._phase = _FULL
        now = self.loop.time()
        cls = type(self)
        if now - cls._full_logged >= _FULL_LOG_S:
            cls._full_logged = now
            where = self.transport.get_extra_info("sockname")
            log.warning("%d connections open on %s: refusing more", cap, where)
        self._ensure_timer(now + FULL_WAIT_S)

    def _refuse_connection(self) -> None:
        self._phase = _CLOSING
        message = f"the server holds {self.limits.max_connections} connections; retry later"
        state, retry = self.server_state, b"retry-after: 1\r\n"
        self.transport.write(edge_rules.error_bytes(state, 503, message, extra=retry))
        self.transport.close()

    def _send_error(self, status: int, message: str) -> None:
        log.info("%s: %d %s", _client(self.client), status, message)
        self.transport.write(edge_rules.error_bytes(self.server_state, status, message, self.url))
        self._close_lingering()

    def _close_lingering(self) -> None:
        """After the last answer: FIN, then discard what the client still sends until its EOF
        or ``LINGER_S`` (so an upload in flight does not turn the answer into a reset)."""
        transport = self.transport
        self._phase = _CLOSING
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()  # the answer, then FIN; the client's EOF (or the timer) closes
        self.flow.resume_reading()
        self._close_due = self.loop.time() + LINGER_S
        self._ensure_timer(self._close_due)


def _client(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "client"


def protocol_class(
    limits: HttpLimits, at_headers: AtHeaders | None = None
) -> type[LimitedHttpToolsProtocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` enforcing ``limits``; ``at_headers``:
    the listener's answer from a request's headers alone (``InferenceApp.at_headers``)."""
    attrs = {
        "limits": limits,
        "_max_size": limits.max_header_size,
        "_max_count": limits.max_header_count,
        "at_headers": staticmethod(at_headers) if at_headers is not None else None,
    }
    return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,), attrs)
