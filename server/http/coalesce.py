"""One write per HTTP response: the response's head held until its first body part
(:class:`CoalescingCycle`, the request/response cycle of ``limits.LimitedHttpToolsProtocol``).
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle


class _Gather:
    """Stands in for the transport while a response's head and first body part are written."""

    __slots__ = ("closed", "parts", "real")

    def __init__(self, real: Any) -> None:
        self.real, self.parts, self.closed = real, [], False

    def write(self, data: bytes) -> None:
        self.parts.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed or self.real.is_closing()


class CoalescingCycle(RequestResponseCycle):
    """uvicorn's request/response cycle with the response's head held until its first body
    part and written with it: one write per response instead of two, so a small answer is one
    TCP segment and wakes the client once (the frontend's biggest per-request syscall cost).
    A head that is never followed by a body is replaced by the next one (uvicorn's 500).

    A request with ``Expect: 100-continue`` answered before the app read its body (a refusal
    from the headers: 503, 401, 404) was never told to send the body, and may or may not send
    it: what follows on the connection cannot be framed. Its answer says ``connection: close``,
    and the connection closes lingering (the body, if it comes, is discarded), RFC 9110 10.1.1.
    """

    _head: Any = None
    close_lingering: Any = None  # the protocol's lingering close

    async def send(self, message: Any) -> None:
        if message["type"] == "http.response.start" and not self.response_started:
            if self.waiting_for_100_continue and self.more_body:
                self.keep_alive = False  # uvicorn adds connection: close
            self._head = message
            return
        head, self._head = self._head, None
        if head is None:
            await super().send(message)
            return
        real = self.transport
        gather = self.transport = _Gather(real)
        try:
            await super().send(head)
            await super().send(message)
        finally:
            self.transport = real
            if gather.parts and not real.is_closing():
                real.writelines(gather.parts)
            if gather.closed:
                if self.more_body and self.close_lingering is not None and not real.is_closing():
                    self.close_lingering()  # the request's body may still be on its way
                else:
                    real.close()
