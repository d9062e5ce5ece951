"""What every gRPC inference RPC shares: authorization from the call's metadata, one
``WireRequest`` per call, admission to the model version's queue with the call's deadline, and
one ``RequestRecord`` per answered request (metrics and the access log, as over HTTP); and what
every service shares (``Service``: its RPCs by name).

The gRPC deadline becomes the queued request's deadline (the mechanism ``clientTimeoutInMills``
uses): a request still queued when its caller's deadline passes is answered DEADLINE_EXCEEDED and
never runs. A caller that leaves (deadline or cancel) cancels its future; the queue drops it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar

import grpc

from torchbay.server.errors import TorchbayError
from torchbay.server.grpc.status import RpcError, abort, from_error
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

    @staticmethod
    def admitted(context: grpc.aio.ServicerContext, item: Pending) -> None:
        """A request just queued: the call's deadline becomes its deadline (the earlier of the
        two: ``clientTimeoutInMills`` may be set too). It is still queued (admit only appends),
        so the queue answers 504 and never runs it once the deadline has passed."""
        remaining = context.time_remaining()
        if remaining is not None:
            deadline = clock() + max(remaining, 0.0)
            item.deadline = deadline if item.deadline is None else min(item.deadline, deadline)

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
        items: list[Pending] = []
        try:
            mv = self.resolve(name, version)
            async for response in self._parts(context, mv, wire(), items):
                status = response.status
                yield response
        except TorchbayError as exc:
            status = exc.status
            raise from_error(exc) from None
        except RpcError as exc:
            status = exc.http_status
            raise
        finally:
            queue_s = None
            if items and items[0].dispatched is not None:
                queue_s = items[0].dispatched - items[0].arrival
            self._record(method, name, version or None, status, started, mv, queue_s)

    async def _parts(
        self,
        context: grpc.aio.ServicerContext,
        mv: ModelVersion,
        wire: p.WireRequest,
        items: list[Pending],
    ) -> AsyncIterator[p.WireResponse]:
        """The responses of one request (``ModelVersion.stream``): each streamed part, then
        the final response; one response when the handler does not stream. Leaving early (a
        deadline, a cancelled call) closes the stream, which cancels the request in the worker."""

        def admitted(item: Pending) -> None:
            items.append(item)
            self.admitted(context, item)

        async with contextlib.aclosing(mv.stream(wire, admitted=admitted)) as parts:
            async for part in parts:
                yield part

    def _record(
        self,
        method: str,
        name: str,
        version: str | None,
        status: int,
        started: float,
        mv: ModelVersion | None,
        queue_s: float | None,
    ) -> None:
        if self.on_request is None:
            return
        scope: dict[str, Any] = {"method": "POST", "path": method, "http_version": "2"}
        seconds = time.perf_counter() - started
        self.on_request(RequestRecord(scope, name, version, status, seconds, queue_s, mv))


class Service:
    """A service of the shipped protos: ``name`` is its full proto name, ``rpcs`` the RPCs it
    implements, each by the method of its name in snake case (``ModelInfer``: ``model_infer``).
    The proto's other RPCs answer UNIMPLEMENTED."""

    name: ClassVar[str]
    rpcs: ClassVar[tuple[str, ...]]

    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    def handlers(self) -> dict[str, Any]:
        """Each RPC's implementation, by RPC name (for ``server.generic_handler``)."""
        return {rpc: getattr(self, _method_name(rpc)) for rpc in self.rpcs}

    async def authorize(self, context: grpc.aio.ServicerContext) -> None:
        """Abort the call (UNAUTHENTICATED) unless it carries a valid inference key."""
        try:
            self.calls.authorize(context)
        except RpcError as exc:
            await abort(context, exc)


def _method_name(rpc: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", rpc).lower()


async def final(responses: AsyncIterator[Any]) -> Any:
    """The last of a request's responses: a unary RPC's answer (a streaming model's parts
    before it are dropped, as a client of a unary RPC can take only one message)."""
    last: Any = None
    async with contextlib.aclosing(responses):  # type: ignore[type-var]
        async for item in responses:
            last = item
    if last is None:
        raise RpcError(grpc.StatusCode.INTERNAL, "The model gave no response")
    return last


__all__ = ["Calls", "RpcError", "Service", "final", "metadata"]
