"""What every gRPC inference RPC shares: authorization from the call's metadata, one
``WireRequest`` per call, admission to the model version's queue with the call's deadline, and
one ``RequestRecord`` per answered request (metrics and the access log, as over HTTP); and what
every service shares (``Service``: its RPCs by name).

The gRPC deadline becomes the queued request's deadline (the mechanism ``clientTimeoutInMills``
uses): a request still queued when its caller's deadline passes is answered DEADLINE_EXCEEDED and
never runs. A caller that leaves (deadline or cancel) cancels its future; the queue drops it.

A client stream (``ClientStream``) is read until its client ends it or the server begins to stop
(``Calls.closing``): a stream the client keeps open between requests, as tritonclient's does,
then ends once its requests are answered (UNAVAILABLE, retryable) instead of holding the
server's stop for the whole grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar, TypeVar

import grpc

from torchbay.server.errors import TorchbayError, Unauthorized
from torchbay.server.grpc.status import RpcError, abort, from_error
from torchbay.server.plane import DataPlane, WireRequest, WireResponse

log = logging.getLogger("torchbay.grpc")
T = TypeVar("T")
_LEFT: set[asyncio.Task] = set()  # operations whose callers left, running to their end
# Raises Unauthorized unless ``authorization`` (the metadata value, or None) holds a valid key
# of ``kind`` ("inference" or "management"): http.auth.TokenAuth.check.
CheckKey = Callable[[str | None, str], None]
# Metadata that is the transport's, not the request's: never passed to the handler. Besides
# gRPC's own, the HTTP headers that say how an HTTP body travels or how its answer is to be
# encoded: the call's message is no HTTP body, and its answer a protobuf message. Passed on,
# ``accept-encoding`` had the worker gzip an OIP answer that ModelInfer then could not parse
# (INTERNAL, every time), and ``content-encoding`` had it inflate a body never compressed (400);
# Triton's gRPC endpoint reads neither (gRPC compresses with ``grpc-encoding``). Whole names
# (and gRPC's ``grpc-`` prefix): as prefixes they took ``tenant`` or ``team`` (``te``) too.
_TRANSPORT = frozenset(
    (
        "authorization",
        "content-type",
        "user-agent",
        "te",
        "accept-encoding",
        "content-encoding",
        "content-length",
        "transfer-encoding",
        "inference-header-content-length",
    )
)


def metadata(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """The call's ASCII metadata (names lower-case; ``-bin`` entries left out)."""
    pairs = context.invocation_metadata() or ()
    return {k.lower(): v for k, v in pairs if isinstance(v, str) and not k.endswith("-bin")}


class Calls:
    """The inference RPCs' way into the data plane (one per server)."""

    def __init__(self, plane: DataPlane, *, check_key: CheckKey | None) -> None:
        self.plane = plane
        self.check_key = check_key
        self._ids = itertools.count(1)
        self._id_prefix = f"{os.getpid():x}-{int(time.time()):x}-g"
        self.closing = asyncio.Event()  # set when the server begins to stop

    def authorize(self, context: grpc.aio.ServicerContext, kind: str = "inference") -> None:
        """Raise RpcError(PERMISSION_DENIED) unless the call carries ``authorization: Bearer``
        with a valid key of ``kind``: TorchServe's GRPCInterceptor closes such a call so on
        every service (REST answers it 401, which the status table maps to UNAUTHENTICATED)."""
        if self.check_key is None:
            return
        try:
            self.check_key(metadata(context).get("authorization"), kind)
        except Unauthorized as exc:
            raise RpcError(grpc.StatusCode.PERMISSION_DENIED, exc.message, exc.status) from None
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
    ) -> WireRequest:
        pairs = metadata(context).items()
        headers = {k: v for k, v in pairs if k not in _TRANSPORT and not k.startswith("grpc-")}
        headers.update(extra or {})
        if content_type:
            headers["content-type"] = content_type
        return WireRequest(
            request_id=self._id_prefix + str(next(self._ids)),
            body=body,
            content_type=content_type,
            headers=headers,
            protocol=protocol,
        )

    async def infer(
        self,
        context: grpc.aio.ServicerContext,
        method: str,
        name: str,
        version: str | None,
        wire: Callable[[], WireRequest],
        *,
        oip: bool = False,
        once: str | None = None,
        convert: Callable[[WireResponse], Any] | None = None,
    ) -> AsyncIterator[Any]:
        """One request through the plane: its responses, each streamed part then the final one
        (one when the handler does not stream); the call's deadline is the request's. Leaving
        early (a deadline, a cancelled call) cancels the request, in the worker too; the plane
        records the call once. ``once`` names an OIP endpoint that answers once (ModelInfer):
        a handler that streams, or answers nothing, is refused (``answers_once``). ``convert``
        makes each response the call's message (yielded instead), inside the exchange: an
        answer it cannot convert (TorchbayError) is recorded as the error it is, and is not
        cached. Raises RpcError."""
        scope: dict[str, Any] = {"method": "POST", "path": method, "http_version": "2"}
        with self.plane.exchange(scope, name, version or None) as ex:
            try:
                ex.resolve()
                responses = ex.responses(wire(), context.time_remaining())
                async with contextlib.aclosing(responses):
                    async for response in responses:
                        if once is not None:
                            ex.answers_once(response, once)
                        yield response if convert is None else convert(response)
            except TorchbayError as exc:
                ex.status = exc.status
                # Its frames hold the request's future, which holds this error: a reference
                # cycle per refused or expired call, left to the garbage collector, unless cut.
                exc.__traceback__ = None
                raise from_error(exc, oip=oip) from None


class ClientStream:
    """A client stream's requests, read until the client ends the stream or ``closing`` is set
    (the server stops); ``cut`` says it was the latter: the RPC answers what it has taken, then
    ends with ``STOPPING``."""

    def __init__(self, requests: AsyncIterator[Any], closing: asyncio.Event) -> None:
        self.requests = requests
        self.closing = closing
        self.cut = False

    def __aiter__(self) -> ClientStream:
        return self

    async def __anext__(self) -> Any:
        read = asyncio.ensure_future(anext(self.requests))
        read.add_done_callback(_seen)  # a call cancelled meanwhile never reads its outcome
        stop = asyncio.ensure_future(self.closing.wait())
        try:
            await asyncio.wait((read, stop), return_when=asyncio.FIRST_COMPLETED)
        finally:  # (a cancelled call leaves neither behind)
            stop.cancel()
            waiting = not read.done()
            if waiting:
                read.cancel()
        if waiting:
            self.cut = True
            raise StopAsyncIteration
        return read.result()  # StopAsyncIteration at the stream's end


async def to_the_end(work: Awaitable[T]) -> T:
    """``work`` (a management operation) run to its end even when its call is cancelled (a
    client's deadline or cancel), as over REST, where a client that leaves does not stop it:
    cancelled half-way, an unregister left its version registered, refusing every request as
    stopping. What it raises when its caller has left is logged."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        _LEFT.add(task)
        task.add_done_callback(_ended)
        raise


def _ended(task: asyncio.Task) -> None:
    _LEFT.discard(task)
    error = None if task.cancelled() else task.exception()
    if isinstance(error, TorchbayError):
        log.warning("a gRPC operation whose caller left failed: %s", error.message)
    elif error is not None:
        log.error("a gRPC operation whose caller left failed", exc_info=error)


def _seen(read: asyncio.Future[Any]) -> None:
    """Mark a read's exception (the stream's end, a broken call) as retrieved."""
    if not read.cancelled():
        read.exception()


# How a stream that the server's stop cut ends, once its requests are answered.
STOPPING = RpcError(
    grpc.StatusCode.UNAVAILABLE, "The server is shutting down: the stream takes no more requests"
)


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
        """Abort the call (PERMISSION_DENIED) unless it carries a valid inference key."""
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


__all__ = [
    "STOPPING",
    "Calls",
    "ClientStream",
    "RpcError",
    "Service",
    "final",
    "metadata",
    "to_the_end",
]
