"""A running batch's streams, frontend side: route each ``Part`` frame to its request's reader
(the first part resolves the request's future, which then moves on to a fresh one for the final
response; later parts go to its ``Parts`` buffer), and tell the worker when a streaming caller
left (its future was cancelled).

Used by ``slot.run_batch`` for every batch; ``ModelVersion.admit_reader``/``rest`` (or
``stream``) is the reader. A request admitted without one (``admit``, no ``Parts``) gets only the
handler's final response: its parts are dropped. A part past ``max_response_size`` ends its
request with a 500, like a final response, and the worker is told to stop producing for it.
A reader that falls behind is bounded the same way: when the parts waiting for it would hold
more than ``max_response_size`` bytes (as much as one whole response), its request is ended
with :class:`SlowReader` (the stream's last answer) and the worker told to stop: a client that
stops reading cannot make the server hold its stream without bound. A stream gathered into one
answer (``/generate``, an HTTP/1.0 client's, a workflow node's) is bounded by :class:`Gathered`.
Torch-free.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from torchbay.server.errors import HandlerFailed, SlowReader, TorchbayError
from torchbay.server.serving import protocol as p
from torchbay.server.serving.parts import Parts
from torchbay.server.serving.queue import Pending, reject

if TYPE_CHECKING:
    from torchbay.server.serving.handle import WorkerProcess

log = logging.getLogger("torchbay.model")


class BatchStreams:
    """The stream bookkeeping of one batch on one worker; ``close`` when the batch is over."""

    def __init__(
        self,
        worker: WorkerProcess,
        batch: list[Pending[p.WireRequest, p.WireResponse]],
        limit: int,
        key: str,
    ) -> None:
        self.worker = worker
        self.limit = limit
        self.key = key
        self.items = {item.payload.request_id: item for item in batch}
        self._watched = [item for item in batch if item.parts is not None]
        for item in self._watched:
            item.future.add_done_callback(self._left)

    def on_part(self, part: p.Part) -> None:
        item = self.items.get(part.request_id)
        if item is None or item.future.done() or item.parts is None:
            return
        size = len(part.response.body)
        if self.limit and size > self.limit:
            message = (
                f"The model's response of {size} bytes exceeds the "
                f"server's max_response_size of {self.limit} bytes"
            )
            self._end(item, part.request_id, HandlerFailed(message))
            return
        if not item.parts.started:
            # The first part answers the reader's await of the request's future (no waiter on
            # the request path: most handlers never stream); the final response and the
            # caller's leaving move to a fresh future, the rest of the parts to the buffer.
            item.parts.started = True
            first, item.future = item.future, asyncio.get_running_loop().create_future()
            item.future.add_done_callback(self._left)
            first.set_result(part.response)
            return
        if self.limit and item.parts.unread + size > self.limit:
            message = (
                f"The client read the stream too slowly: more than the server's "
                f"max_response_size of {self.limit} bytes of it were waiting to be sent"
            )
            self._end(item, part.request_id, SlowReader(message))
            return
        item.parts.push(part.response, size)

    def _end(self, item: Pending, request_id: str, error: TorchbayError) -> None:
        """End a request on ``error`` (its reader's last answer) and tell the worker to stop
        producing for it (nobody will read its further parts)."""
        log.error("model %s: request %s: %s; the request is ended", self.key, request_id, error)
        reject(item.future, error)
        self.worker.cancel(request_id)

    def _left(self, future: asyncio.Future) -> None:
        if not future.cancelled():
            return
        for request_id, item in self.items.items():
            if item.future is future:
                self.worker.cancel(request_id)

    def close(self) -> None:
        for item in self._watched:
            item.future.remove_done_callback(self._left)  # the current future: see on_part


async def later_parts(item: Pending, parts: Parts) -> AsyncIterator[p.WireResponse]:
    """A reader's answers after its first part (``ModelVersion.rest``)."""
    while True:  # the final response comes on a fresh future (see on_part)
        await parts.wait(item.future)
        if parts.items:
            yield parts.pop()
            continue
        final = item.future.result()
        if final.body or final.status >= 400:
            yield final
        return


class Gathered:
    """The bytes of a stream gathered into one answer, bounded as a whole response is: past
    ``max_response_size`` (0: no bound) ``add`` raises HandlerFailed, the 500 of a handler's
    response that is too large. Raised while the stream is read, it closes the stream (the
    worker is told to stop); nothing was sent, so the route answers the error."""

    def __init__(self, limit: int) -> None:
        self.limit, self.size = limit, 0

    def add(self, body: bytes) -> bytes:
        self.size += len(body)
        if self.limit and self.size > self.limit:
            raise HandlerFailed(
                f"The model's streamed response of more than {self.limit} bytes exceeds the "
                f"server's max_response_size of {self.limit} bytes"
            )
        return body
