"""``inference.GRPCInferenceService``: the KServe v2 / Open Inference Protocol over gRPC (the
RPCs of KServe's ``grpc_predict_v2.proto`` plus Triton's ``ModelStreamInfer``).

Live, ready and metadata answer what the REST endpoints answer (``http/inference.py``); model
ready and metadata need the inference key, as over REST. ``ModelInfer`` becomes the REST
request of the binary tensor data extension (``tensors.py``) with protocol ``"v2"``, through the
model's queue like every other request. ``ModelStreamInfer`` runs each request of the stream as
it arrives, and writes each request's first answer only after the first answer of the request
before it: in the order the requests came, as Triton writes a non-decoupled model's responses
(its stream infer handler queues them), so that a client whose callback gets an error, which
names no request, can tell which request failed. torchbay does not know a decoupled model from
its configuration: a streaming handler's later parts go as they come. An error goes into that
response's ``error_message`` and the stream goes on. A request
whose parameter ``triton_enable_empty_final_response`` is true (tritonclient's
``enable_empty_final_response``) gets Triton's ``triton_final_response`` parameter on each of its
responses: false on a streamed part, true on its final response; a streaming handler that ends
without one (a generator's end) is answered, as Triton answers a decoupled model's bare final
flag, with an empty response that carries only the flag (and the request's id and model). A
stream started with the metadata ``triton_grpc_error: true`` (Triton's, since 24.08) instead
ends at its first error, with that error as the call's status: the requests answered before it
are written, none after.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import grpc

from torchbay.server.errors import BadRequest, ModelNotFound, TorchbayError
from torchbay.server.grpc import tensors
from torchbay.server.grpc.calls import STOPPING, ClientStream, final, metadata
from torchbay.server.grpc.messages import OIP_SERVICE, message
from torchbay.server.grpc.shm import OPERATIONS as SHM_RPCS
from torchbay.server.grpc.shm import SharedMemoryRpcs
from torchbay.server.grpc.status import (
    RpcError,
    abort,
    answer_error,
    from_error,
    from_response,
    succeeded,
)
from torchbay.server.grpc.triton import OPERATIONS as TRITON_RPCS

log = logging.getLogger("torchbay.grpc")
_INFER_PATH = f"/{OIP_SERVICE}/ModelInfer"
_STREAM_PATH = f"/{OIP_SERVICE}/ModelStreamInfer"
# The answers of a ModelStreamInfer call that may wait for its client to read them.
_AHEAD = 16
EMPTY_FINAL = "triton_enable_empty_final_response"  # Triton's request parameter
FINAL = "triton_final_response"  # and the response parameter it turns on
GRPC_ERROR = "triton_grpc_error"  # the stream's metadata: "true" ends it at its first error
TRITON_OPERATIONS = (*TRITON_RPCS, *SHM_RPCS)
# Each RPC's plane operation (its ServerMetadata extensions come from them).
_OPERATION = {"ModelInfer": "infer", **TRITON_RPCS, **SHM_RPCS}
T = TypeVar("T")


class OipService(SharedMemoryRpcs):
    name = OIP_SERVICE
    rpcs = (
        "ServerLive",
        "ServerReady",
        "ModelReady",
        "ServerMetadata",
        "ModelMetadata",
        "ModelInfer",
        "ModelStreamInfer",
        *TRITON_OPERATIONS,
    )

    async def server_live(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return message("inference.ServerLiveResponse")(live=True)

    async def server_ready(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return message("inference.ServerReadyResponse")(ready=self.calls.plane.ready())

    async def server_metadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        meta = self.calls.plane.server_metadata(_OPERATION.get(rpc, rpc) for rpc in self.rpcs)
        return message("inference.ServerMetadataResponse")(**meta)

    async def model_ready(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        ready = await self._model(request, context, self._ready)
        return message("inference.ModelReadyResponse")(ready=ready)

    def _ready(self, name: str, version: str | None) -> bool:
        """Triton answers a model of its repository that is not loaded with ``ready: false``,
        not an error (tritonclient's is_model_ready raises on one: its model-control examples
        ask after an unload); a name no archive of the store has stays NOT_FOUND."""
        plane = self.calls.plane
        try:
            return plane.model_ready(name, version)[1]
        except ModelNotFound:
            if plane.models.in_store(name):
                return False
            raise

    async def model_metadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        meta = await self._model(request, context, self.calls.plane.models.metadata)
        response = message("inference.ModelMetadataResponse")(
            name=meta["name"], versions=meta["versions"], platform=meta["platform"]
        )
        for key in ("inputs", "outputs"):
            for tensor in meta[key]:
                getattr(response, key).add(
                    name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"]
                )
        return response

    async def _model(
        self, request: Any, context: grpc.aio.ServicerContext, operation: Callable[..., T]
    ) -> T:
        """``operation(name, version)`` of a model RPC (it needs the inference key, as over
        REST), or the call aborted with its error."""
        try:
            self.calls.authorize(context)
            return operation(request.name, request.version or None)
        except RpcError as exc:
            await abort(context, exc)
        except TorchbayError as exc:
            await abort(context, from_error(exc, oip=True))
        raise AssertionError("abort raises")

    async def model_infer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            self.calls.authorize(context)
            return await final(self._responses(request, context, _INFER_PATH, once=True))
        except RpcError as exc:
            answer_error(context, exc)  # no abort: see answer_error
            return None

    async def _responses(
        self,
        request: Any,
        context: grpc.aio.ServicerContext,
        path: str,
        flag: bool | None = None,
        *,
        once: bool = False,
    ) -> AsyncIterator[Any]:
        """One ModelInferRequest through the queue: a ModelInferResponse per part (one for a
        model that does not stream); RpcError for an error. ``flag`` (a stream's request: not
        None) is whether it asks for ``triton_final_response``: then each response carries it,
        and a stream that ends on a part, or with no answer at all (a generator that yielded
        nothing: Triton's decoupled model that sent no response), gets an empty final one.
        ``once`` (ModelInfer): a handler that streams or answers nothing is refused."""

        def wire() -> Any:  # read inside the plane's exchange: a refusal is recorded there
            if flag is not None:
                _take_final_flag(request)  # BadRequest for a value that is not a bool
            body, head_len = tensors.request_body(request)  # BadRequest: calls.infer's 400
            return self.calls.wire(
                context,
                body,
                content_type=tensors.CONTENT_TYPE,
                protocol="v2",
                extra={tensors.HEADER_LENGTH: str(head_len)},
            )

        name, version = request.model_name, request.model_version

        def converted(response: Any) -> tuple[Any, Any]:  # in the exchange: a failure recorded
            if not succeeded(response.status) or (not response.partial and not response.body):
                return response, None
            return response, tensors.infer_response(response.body, response.headers, name, version)

        once_name = "ModelInfer RPC" if once else None
        responses = self.calls.infer(
            context, path, name, version, wire, oip=True, once=once_name, convert=converted
        )
        ended = False  # the last response was a final one (not a streamed part)
        async with contextlib.aclosing(responses):
            async for response, out in responses:
                if not succeeded(response.status):
                    raise from_response(response.status, response.body)
                if out is None:
                    continue  # a stream that ended with no answer: only the flag to write
                ended = not response.partial
                if flag:
                    out.parameters[FINAL].bool_param = ended
                yield out
        if flag and not ended:
            yield _empty_final(request)

    async def model_stream_infer(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        await self.authorize(context)
        # Bounded: a client that reads slowly holds the requests' tasks back, so their parts
        # wait in the plane's buffer, which ends a stream that runs too far ahead (SlowReader).
        done: asyncio.Queue[Any] = asyncio.Queue(maxsize=_AHEAD)
        stream = ClientStream(requests, self.calls.closing)
        reader = asyncio.ensure_future(self._read_stream(stream, context, done))
        try:
            while (item := await done.get()) is not None:
                if isinstance(item, RpcError):  # triton_grpc_error: the stream's status
                    await abort(context, item)
                yield item
            if stream.cut:  # the server stops: every request taken is answered
                await abort(context, STOPPING)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _read_stream(
        self, requests: ClientStream, context: grpc.aio.ServicerContext, done: asyncio.Queue
    ) -> None:
        """Start one task per request as it arrives; put each answer on ``done``, then None.
        Each request's turn (a future) is done once its first answer is out; the next
        request's first answer waits for it."""
        tasks: set[asyncio.Task] = set()
        ended = False
        turn: asyncio.Future[None] | None = None
        try:
            async for request in requests:
                after, turn = turn, asyncio.get_running_loop().create_future()
                task = asyncio.ensure_future(self._stream_one(request, context, done, after, turn))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks)
            await done.put(None)  # after every answer, as the client reads them
            ended = True
        finally:
            for task in tasks:
                task.cancel()
            if not ended and not done.full():  # a broken call: nobody may read any more
                done.put_nowait(None)

    async def _stream_one(
        self,
        request: Any,
        context: grpc.aio.ServicerContext,
        done: asyncio.Queue,
        after: asyncio.Future[None] | None,
        turn: asyncio.Future[None],
    ) -> None:
        """Answer one request of the stream: its first answer waits for ``after`` (the turn of
        the request before), then ``turn`` is done. A request that ends without an answer
        passes its turn on when ``after`` is done: a later one never waits for one gone."""
        try:
            async with contextlib.aclosing(self._stream_answers(request, context)) as answers:
                async for item in answers:
                    if after is not None and not turn.done():
                        await asyncio.shield(after)
                    await done.put(item)
                    _pass(turn)
        finally:
            if after is None or after.done():
                _pass(turn)
            else:
                after.add_done_callback(lambda _: _pass(turn))

    async def _stream_answers(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        """Each ModelStreamInferResponse of one request: its parts, or its error (the
        RpcError itself in a ``triton_grpc_error`` stream: it ends the stream)."""
        out = message("inference.ModelStreamInferResponse")()
        flag = _asks_final(request)
        try:
            async for part in self._responses(request, context, _STREAM_PATH, flag):
                yield message("inference.ModelStreamInferResponse")(infer_response=part)
            return
        except RpcError as exc:
            error = exc
        except Exception:  # a bug of ours: this request's answer says so, the stream goes on
            log.exception("gRPC ModelStreamInfer request failed")
            error = RpcError(grpc.StatusCode.INTERNAL, "Internal server error")
        if metadata(context).get(GRPC_ERROR) == "true":
            yield error
            return
        out.error_message = error.details
        out.infer_response.id = request.id
        if flag:  # an error ends the request: Triton flags its error response final
            out.infer_response.parameters[FINAL].bool_param = True
        yield out


def _pass(turn: asyncio.Future[None]) -> None:
    if not turn.done():
        turn.set_result(None)


def _asks_final(request: Any) -> bool:
    """Whether the request asks for ``triton_final_response`` (a bool parameter, true)."""
    if EMPTY_FINAL not in request.parameters:
        return False
    value = request.parameters[EMPTY_FINAL]
    return value.WhichOneof("parameter_choice") == "bool_param" and value.bool_param


def _take_final_flag(request: Any) -> None:
    """Take Triton's ``triton_enable_empty_final_response`` out of the request (it is the
    server's, not the model's); BadRequest for a value that is not a bool."""
    if EMPTY_FINAL not in request.parameters:
        return
    kind = request.parameters[EMPTY_FINAL].WhichOneof("parameter_choice")
    del request.parameters[EMPTY_FINAL]
    if kind != "bool_param":
        raise BadRequest(f"invalid value type for '{EMPTY_FINAL}' parameter, expected bool_param.")


def _empty_final(request: Any) -> Any:
    """Triton's empty final response: the request's id and model, and the flag."""
    out = message("inference.ModelInferResponse")(
        id=request.id, model_name=request.model_name, model_version=request.model_version
    )
    out.parameters[FINAL].bool_param = True
    return out
