"""What every gRPC inference RPC shares: authorization from the call's metadata, one
``WireRequest`` per call, admission to the model version's queue with the call's deadline, and
one ``RequestRecord`` per answered request (metrics and the access log, as over HTTP).

The gRPC deadline becomes the queued request's deadline (the mechanism ``clientTimeoutInMills``
uses): a request still queued when its caller's deadline passes is answered DEADLINE_EXCEEDED and
never runs. A caller that leaves (deadline or cancel) cancels its future; the queue drops it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from torchbay.server.errors import RequestTimeout, TorchbayError
from torchbay.server.grpc.status import RpcError, from_error
from torchbay.server.observe.logs import RequestHook, RequestRecord
from torchbay.server.serving import protocol as p
from torchbay.server.serving.model import ModelVersion
from torchbay.server.serving.queue import Pending, clock
from torchbay.server.serving.registry import ModelRegistry

# Raises Unauthorized unless ``authorization`` (the metadata value, or None) holds a valid key
# of ``kind`` ("inference" or "management"): http.auth.TokenAuth.check.
CheckKey = Callable[[str | None, str], None]
# Metadata that is the transport's, not the request's: never passed to the handler.
_TRANSPORT = ("authorization", "content-type", "user-agent", "te", "grpc-")


def metadata(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """The call's ASCII metadata (names lower-case; ``-bin`` entries left out)."""
    pairs = context.invocation_metadata() or ()
    return {k.lower(): v for k, v in pairs if isinstance(v, str) and not k.endswith("-bin")}


class Calls:
    """The inference RPCs' way into the registry (one per server)."""

    def __init__(
        self,
        registry: ModelRegistry,
        *,
        check_key: CheckKey | None,
        server_version: str,
        on_request: RequestHook | None = None,
    ) -> None:
        self.registry = registry
        self.check_key = check_key
        self.server_version = server_version
        self.on_request = on_request
        self._ids = itertools.count(1)
        self._id_prefix = f"{os.getpid():x}-{int(time.time()):x}-g"

    def authorize(self, context: grpc.aio.ServicerContext, kind: str = "inference") -> None:
        """Raise RpcError(UNAUTHENTICATED) unless the call carries ``authorization: Bearer``
        with a valid key of ``kind``."""
        if self.check_key is None:
            return
        try:
            self.check_key(metadata(context).get("authorization"), kind)
        except TorchbayError as exc:
            raise from_error(exc) from None

    def resolve(self, name: str, version: str | None) -> ModelVersion:
        try:
            return self.registry.resolve(name, version or None)
        except TorchbayError as exc:
            raise from_error(exc) from None

    def wire(
        self,
        context: grpc.aio.ServicerContext,
        body: bytes,
        *,
        content_type: str,
        protocol: str,
        extra: dict[str, str] | None = None,
    ) -> p.WireRequest:
        headers = {k: v for k, v in metadata(context).items() if not k.startswith(_TRANSPORT)}
        headers.update(extra or {})
        if content_type:
            headers["content-type"] = content_type
        return p.WireRequest(
            request_id=self._id_prefix + str(next(self._ids)),
            body=body,
            content_type=content_type,
            headers=headers,
            protocol=protocol,
        )

    async def submit(
        self,
        context: grpc.aio.ServicerContext,
        mv: ModelVersion,
        wire: p.WireRequest,
        timing: dict[str, float] | None = None,
    ) -> p.WireResponse:
        """Admit ``wire`` to ``mv``'s queue with the call's deadline; its one response (and its
        queue time in ``timing["queue_s"]`` once a worker took it). Raises RpcError for a
        refusal (503, 504, ...) as for any other error of ours."""
        try:
            item = self._admit(context, mv, wire)
        except TorchbayError as exc:
            raise from_error(exc) from None
        mv.inflight += 1
        try:
            return await item.future
        except TorchbayError as exc:
            raise from_error(exc) from None
        finally:
            mv.inflight -= 1
            if timing is not None and item.dispatched is not None:
                timing["queue_s"] = item.dispatched - item.arrival

    def _admit(
        self, context: grpc.aio.ServicerContext, mv: ModelVersion, wire: p.WireRequest
    ) -> Pending[p.WireRequest, p.WireResponse]:
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            raise RequestTimeout("The call's deadline passed before it was queued; not run")
        item = mv.admit(wire)
        if remaining is not None:
            deadline = clock() + remaining
            # Still queued (admit only appends): the earlier of the two deadlines applies.
            item.deadline = deadline if item.deadline is None else min(item.deadline, deadline)
        return item

    async def infer(
        self,
        context: grpc.aio.ServicerContext,
        method: str,
        name: str,
        version: str | None,
        wire: Callable[[], p.WireRequest],
    ) -> AsyncIterator[p.WireResponse]:
        """Resolve the model, build its request, yield its responses (``_parts``); one
        ``RequestRecord`` for the whole call. Raises RpcError."""
        started = time.perf_counter()
        mv: ModelVersion | None = None
        status = 499  # the caller left (deadline or cancel) before an answer
        timing: dict[str, float] = {}
        try:
            mv = self.resolve(name, version)
            async for response in self._parts(context, mv, wire(), timing):
                status = response.status
                yield response
        except RpcError as exc:
            status = exc.http_status
            raise
        finally:
            self._record(method, name, version or None, status, started, mv, timing)

    async def _parts(
        self,
        context: grpc.aio.ServicerContext,
        mv: ModelVersion,
        wire: p.WireRequest,
        timing: dict[str, float],
    ) -> AsyncIterator[p.WireResponse]:
        """The responses of one request: today the single ``submit`` result. At merge with the
        streaming branch: ``mv.stream(wire)``'s intermediate parts, then the final one."""
        yield await self.submit(context, mv, wire, timing)

    def _record(
        self,
        method: str,
        name: str,
        version: str | None,
        status: int,
        started: float,
        mv: ModelVersion | None,
        timing: dict[str, float],
    ) -> None:
        if self.on_request is None:
            return
        scope: dict[str, Any] = {"method": "POST", "path": method, "http_version": "2"}
        seconds = time.perf_counter() - started
        queue_s = timing.get("queue_s")
        self.on_request(RequestRecord(scope, name, version, status, seconds, queue_s, mv))


async def first(responses: AsyncIterator[Any]) -> Any:
    """The first item of an RPC's responses (a unary RPC); the iterator is closed after it."""
    async with contextlib.aclosing(responses):  # type: ignore[type-var]
        async for item in responses:
            return item
    raise RpcError(grpc.StatusCode.INTERNAL, "The model gave no response")


__all__ = ["Calls", "RpcError", "first", "metadata"]
