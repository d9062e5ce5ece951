"""TorchServe's ``org.pytorch.serve.grpc.inference.InferenceAPIsService``: Ping, Predictions,
StreamPredictions (server streaming) and StreamPredictions2 (bidirectional).

A ``PredictionsRequest``'s ``input`` map reaches the handler as TorchServe builds it for gRPC
(``InferenceImpl``: one ``InputParameter`` per entry, bytes, no content type): the entries travel
as a multipart/form-data body, one field (no filename, no content type) per key, so the worker's
row decoding gives the handler ``{"data": bytearray(b"..."), "key": ...}`` and each one's
content type among its headers as ``""``, as TorchServe's. The answer's body is
``prediction``. An error is the call's status (TorchServe's ``GRPCUtils`` table, ``status.py``),
except in StreamPredictions2, where (as in TorchServe) it is the ``status`` of that request's
response and the stream goes on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

import grpc

from torchbay.server.grpc.calls import STOPPING, ClientStream, Service, final
from torchbay.server.grpc.messages import TS_INFERENCE_SERVICE, message
from torchbay.server.grpc.status import RpcError, abort, answer_error, from_response, succeeded

_RESPONSE = "org.pytorch.serve.grpc.inference.PredictionResponse"
_FORBIDDEN_IN_NAMES = ('"', "\r", "\n", "\\")


def multipart(fields: Any) -> tuple[bytes, str]:
    """The ``input`` map as a multipart/form-data body (fields: the handler gets bytearrays, of
    no content type); (body, content type). An empty map is an empty body with no content
    type."""
    if not fields:
        return b"", ""
    boundary = _boundary(fields)
    chunks: list[bytes] = []
    for key in sorted(fields):
        if any(c in key for c in _FORBIDDEN_IN_NAMES):
            raise RpcError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"input key {key[:64]!r} may not contain quotes, backslashes or line breaks",
                400,
            )
        disposition = f'form-data; name="{key}"'.encode()
        chunks += (
            f"--{boundary}\r\n".encode(),
            b"Content-Disposition: " + disposition + b"\r\n\r\n",
            bytes(fields[key]),
            b"\r\n",
        )
    chunks.append(f"--{boundary}--\r\n".encode())
    return b"".join(chunks), f"multipart/form-data; boundary={boundary}"


def _boundary(fields: Any) -> str:
    """A boundary derived from the entries, so that the same request is the same body (the
    response cache's key, ``plane/cache.py``); random in the unlikely case that it occurs in an
    entry (that body then differs each time: never a hit, never a wrong answer)."""
    digest = hashlib.blake2b(digest_size=16)
    for key in sorted(fields):
        value = bytes(fields[key])
        digest.update(f"{key}\0{len(value)}\0".encode("utf-8", "replace") + value)
    boundary = "torchbay-" + digest.hexdigest()
    if any(boundary.encode() in bytes(v) for v in fields.values()):
        return "torchbay-" + secrets.token_hex(16)
    return boundary


def _sequence_headers(request: Any, names: tuple[str, str, str]) -> dict[str, str]:
    """A request's sequence as TorchServe's headers (plane/sequence_params.py reads them): the
    ``sequence_id`` field, and the ``input`` entries that TorchServe reads as start and end
    (named as the headers: ``names``, the server's id, start and end, lower-case; any case)."""
    headers = {}
    if request.HasField("sequence_id") and request.sequence_id:
        headers[names[0]] = request.sequence_id
    for key, value in request.input.items():
        if key.lower() in names[1:]:
            headers[key.lower()] = bytes(value).decode("utf-8", "replace")
    return headers


def _check_sequence(request: Any, names: tuple[str, str, str]) -> None:
    """StreamPredictions2 streams a sequence: a request with neither a ``sequence_id`` nor a
    start flag (``input``'s entry of the start name, true) is refused in TorchServe 0.12's
    words (its InferenceImpl.java), whatever the model; the stream goes on. TorchServe answers
    INTERNAL (and, reading the flag as a ByteString's text, refuses a start without an id
    too); here INVALID_ARGUMENT, the client's mistake, and a start gets the id the server
    makes (as over REST)."""
    if request.HasField("sequence_id") and request.sequence_id:
        return
    start = [bytes(v) for k, v in request.input.items() if k.lower() == names[1]]
    if not start or start[-1].decode("utf-8", "replace").strip().lower() != "true":
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "Parameter sequenceId is required.")


def _header(headers: dict[str, str], name: str) -> str | None:
    """The value of the header ``name`` (lower-case) in ``headers`` of any case."""
    found = [v for k, v in headers.items() if k.lower() == name]
    return found[-1] if found else None


class TorchServeInference(Service):
    name = TS_INFERENCE_SERVICE
    rpcs = ("Ping", "Predictions", "StreamPredictions", "StreamPredictions2")

    async def ping(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        healthy = self.calls.plane.healthy()
        health = json.dumps({"status": "Healthy" if healthy else "Unhealthy"}, indent=2)
        return message("org.pytorch.serve.grpc.inference.TorchServeHealthResponse")(health=health)

    async def _responses(
        self, request: Any, context: grpc.aio.ServicerContext, method: str
    ) -> AsyncIterator[Any]:
        """The PredictionResponses of one request; RpcError for an error."""

        def wire() -> Any:  # read inside the plane's exchange: a refusal is recorded there
            body, content_type = multipart(request.input)
            extra = _sequence_headers(request, names)
            return self.calls.wire(
                context, body, content_type=content_type, protocol="predict", extra=extra
            )

        names = self.calls.plane.sequence_headers
        path = f"/{TS_INFERENCE_SERVICE}/{method}"
        name, version = request.model_name, request.model_version
        responses = self.calls.infer(context, path, name, version, wire)
        async with contextlib.aclosing(responses):
            async for response in responses:
                if not succeeded(response.status):
                    raise from_response(response.status, response.body)
                out = message(_RESPONSE)(prediction=response.body)
                sequence_id = _header(response.headers, names[0])  # a sequence model's (it may
                if sequence_id is not None:  # have started the sequence and named it)
                    out.sequence_id = sequence_id
                elif request.HasField("sequence_id"):
                    out.sequence_id = request.sequence_id
                yield out

    async def predictions(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            self.calls.authorize(context)
            return await final(self._responses(request, context, "Predictions"))
        except RpcError as exc:
            answer_error(context, exc)  # no abort: see answer_error
            return None

    async def stream_predictions(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        try:
            self.calls.authorize(context)
            async for out in self._responses(request, context, "StreamPredictions"):
                yield out
        except RpcError as exc:
            await abort(context, exc)

    async def stream_predictions2(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        """Requests in order, each answered (parts, then the last) before the next runs."""
        await self.authorize(context)
        stream = ClientStream(requests, self.calls.closing)
        async for request in stream:
            try:
                _check_sequence(request, self.calls.plane.sequence_headers)
                async for out in self._responses(request, context, "StreamPredictions2"):
                    yield out
            except RpcError as exc:
                out = message(_RESPONSE)()
                out.status.code = exc.code.value[0]
                out.status.message = exc.details
                if request.HasField("sequence_id"):
                    out.sequence_id = request.sequence_id
                yield out
        if stream.cut:  # the server stops: every request taken is answered
            await abort(context, STOPPING)
