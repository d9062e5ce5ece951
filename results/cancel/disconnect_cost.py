"""What noticing an HTTP client's disconnect costs per request while the request waits for its
answer (server/http/disconnect.py), on the event loop the server uses (uvloop).

Each "request" awaits a future that another loop callback resolves, as a worker's answer does:

* ``bare``: ``await future`` (before cancellation: a disconnect went unnoticed);
* ``hook``: ``disconnect.first_answer`` (the shipped way: the scope holds the exchange's
  ``leave`` for the protocol's ``connection_lost``; a dict store and delete, one more frame);
* ``task``: the ASGI way, a task awaiting uvicorn's ``receive()`` beside the answer (its
  ``message_event.wait()``), cancelled once answered.

Run: ``.venv/bin/python results/cancel/disconnect_cost.py`` (best of 5 runs of 200k requests,
1 and 64 requests in flight). Numbers in disconnect_cost.txt.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import uvloop

from torchbay.server.http.disconnect import first_answer


class Cycle:
    """uvicorn's ``RequestResponseCycle.receive`` after the body was read."""

    def __init__(self) -> None:
        self.message_event = asyncio.Event()
        self.disconnected = False

    async def receive(self) -> dict[str, Any]:
        if not self.disconnected:
            await self.message_event.wait()
            self.message_event.clear()
        return {"type": "http.disconnect"}


class Exchange:
    status = 500

    def leave(self) -> None:
        self.status = 499


def _answered(loop: asyncio.AbstractEventLoop) -> asyncio.Future:
    future = loop.create_future()
    loop.call_soon(future.set_result, 1)  # the worker's answer, one callback later
    return future


async def bare(loop, cycle, scope, ex) -> Any:
    return await _answered(loop)


async def hook(loop, cycle, scope, ex) -> Any:
    return await first_answer(scope, ex, _answered(loop))


async def task(loop, cycle, scope, ex) -> Any:
    future = _answered(loop)
    watcher = asyncio.ensure_future(cycle.receive())

    def left(_: asyncio.Future) -> None:
        future.cancel()

    watcher.add_done_callback(left)
    try:
        return await future
    finally:
        watcher.remove_done_callback(left)
        watcher.cancel()


async def run(fn, n: int, concurrency: int) -> float:
    loop = asyncio.get_running_loop()

    async def client() -> None:
        cycle, scope, ex = Cycle(), {}, Exchange()
        for _ in range(n // concurrency):
            await fn(loop, cycle, scope, ex)

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return (time.perf_counter() - start) / n * 1e6


async def main() -> None:
    n = 200_000
    for concurrency in (1, 64):
        best = {f.__name__: float("inf") for f in (bare, hook, task)}
        for _ in range(5):
            for f in (bare, hook, task):
                best[f.__name__] = min(best[f.__name__], await run(f, n, concurrency))
        line = ", ".join(f"{name} {us:.2f} us" for name, us in best.items())
        print(f"{concurrency:>2} in flight: {line}")


if __name__ == "__main__":
    (asyncio.run if "--asyncio" in sys.argv else uvloop.run)(main())
