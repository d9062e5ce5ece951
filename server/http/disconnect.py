"""Noticing an HTTP client that disconnects while its request waits for its first answer, so
that the data plane cancels the request (still queued: it never runs; running: its result is
dropped) instead of running it for nobody.

The ASGI way is to await ``receive()``, which answers ``http.disconnect`` once the connection is
lost, beside the answer. That costs a task per request and the event-loop turns to start and
cancel it: 16 to 20 us per request here (uvloop), a fifth of the frontend's whole cost of a
small request (results/cancel/disconnect_cost.txt). Instead the HTTP protocol tells us: while
a request waits, its scope holds the exchange's ``leave`` under ``LEFT``, and
``limits.LimitedHttpToolsProtocol.connection_lost`` calls it (:func:`client_left`). Per request
that is one dict store and one delete, no task, no waiter, no timer. A streamed answer's later
parts watch ``receive()`` instead (streaming.py): they have a task per part anyway.

With HTTP/1.1 pipelining uvicorn tells only the connection's latest request read, one queued
that never started; the protocol tells the request being answered too (waiting or streaming),
so it is cancelled rather than run for nobody. Torch-free.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

from torchbay.server.http.asgi import Scope
from torchbay.server.plane import CLIENT_LEFT, Exchange, WireResponse

LEFT = "torchbay.left"  # the scope key of the waiting request's hook (the exchange's leave)
T = TypeVar("T")


def client_left(cycle: Any) -> None:
    """The connection of ``cycle`` (uvicorn's request/response cycle, or None) is lost."""
    if cycle is not None:
        leave = cycle.scope.get(LEFT)
        if leave is not None:
            leave()


async def first_answer(scope: Scope, ex: Exchange, future: asyncio.Future) -> WireResponse | None:
    """``future``'s result (the request's first answer), or None when the client disconnected
    while it waited: the request is then cancelled and the exchange records 499."""
    scope[LEFT] = ex.leave
    try:
        return await future
    except asyncio.CancelledError:
        if ex.status != CLIENT_LEFT:
            raise  # this task itself was cancelled (the server stops)
        return None
    finally:
        del scope[LEFT]


async def unless_left(scope: Scope, ex: Exchange, work: Awaitable[T]) -> T | None:
    """``work``'s result, or None when the client disconnected while it ran (the exchange then
    records 499): work that gives the loop turns before anything is queued, such as KServe v1's
    body parsed in steps, during which a disconnect went unnoticed and every instance ran for
    nobody."""
    scope[LEFT] = ex.leave
    try:
        result = await work
    finally:
        del scope[LEFT]
    return None if ex.status == CLIENT_LEFT else result


async def all_answers(
    scope: Scope, ex: Exchange, futures: Sequence[asyncio.Future]
) -> list[WireResponse | BaseException] | None:
    """Every one of ``futures``' results or errors, in order (KServe v1's instances), or None
    when the client disconnected while they were pending: every request still unanswered is
    then cancelled (queued: it never runs) and the exchange records 499."""
    scope[LEFT] = ex.leave
    try:
        results = await asyncio.gather(*futures, return_exceptions=True)
    finally:
        del scope[LEFT]
    return None if ex.status == CLIENT_LEFT else results
