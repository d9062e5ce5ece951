"""A streaming request's intermediate parts (``Parts``), buffered for its one reader, and the
rest of a request that streamed nothing (``NO_PARTS``). See serving/queue.py's docstring and
serving/streams.py, which routes each part here. Torch-free."""

from __future__ import annotations

import asyncio
import collections
from typing import Any, Generic, TypeVar

R = TypeVar("R")


class Parts(Generic[R]):
    """A streaming request's intermediate parts, in arrival order, for one reader. The first
    part does not come here: it resolves the request's future (``started`` says it did, and the
    ``Pending`` then holds a fresh future for the final response); the later ones do."""

    def __init__(self) -> None:
        self.items: collections.deque[tuple[R, int]] = collections.deque()
        self.unread = 0  # bytes of the buffered parts (the sizes given to ``push``)
        self.started = False
        self._waiter: asyncio.Future[None] | None = None

    def push(self, part: R, size: int = 0) -> None:
        self.items.append((part, size))
        self.unread += size
        self._wake()

    def pop(self) -> R:
        part, size = self.items.popleft()
        self.unread -= size
        return part

    def _wake(self, _: object = None) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self, future: asyncio.Future) -> None:
        """Return once a part is buffered or ``future`` (the final response) is done."""
        if self.items or future.done():
            return
        self._waiter = asyncio.get_running_loop().create_future()
        future.add_done_callback(self._wake)
        try:
            await self._waiter
        finally:
            future.remove_done_callback(self._wake)
            self._waiter = None


class _NoParts:
    """The rest of a request whose first answer was its final one: nothing (no generator)."""

    def __aiter__(self) -> _NoParts:
        return self

    async def __anext__(self) -> Any:
        raise StopAsyncIteration

    async def aclose(self) -> None:
        pass


NO_PARTS: Any = _NoParts()
