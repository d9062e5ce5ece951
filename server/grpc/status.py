"""HTTP statuses and our error tree (``server.errors``) as gRPC status codes.

The table is TorchServe's (``GRPCUtils.getGRPCStatusCode``), which agrees with how Triton maps its
own errors: 400 INVALID_ARGUMENT, 401 UNAUTHENTICATED, 403 PERMISSION_DENIED, 404 NOT_FOUND,
409 ABORTED, 413/429 RESOURCE_EXHAUSTED, 499 CANCELLED, 501 UNIMPLEMENTED, 503 UNAVAILABLE,
504 DEADLINE_EXCEEDED; any other 4xx FAILED_PRECONDITION, any other 5xx INTERNAL; Triton's
ALREADY_EXISTS (a taken shared-memory region name, ``AlreadyExists``) and CANCELLED (the requests
of a cancelled sequence, ``SequenceCancelled``) are 400 over HTTP. The details
string is the same clear message the HTTP API answers (never a traceback or a path: the worker
and our errors already guarantee that of what they say).
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

import grpc

from torchbay.server.errors import TorchbayError

_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.ABORTED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    416: grpc.StatusCode.OUT_OF_RANGE,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
# Errors whose gRPC code is not their HTTP status's: Triton's ALREADY_EXISTS and CANCELLED (a
# cancelled sequence's requests) are HTTP 400.
_BY_ERROR_CODE = {
    "already_exists": grpc.StatusCode.ALREADY_EXISTS,
    "sequence_cancelled": grpc.StatusCode.CANCELLED,
}
MAX_DETAILS = 4096  # characters of a handler's message kept in the status details
# ... and bytes of them as gRPC sends them (grpc-message: UTF-8, percent-encoded but for printable
# ASCII): a client takes 8 KiB of metadata by default, and past it (with certainty past 16 KiB)
# reports RESOURCE_EXHAUSTED "Stream removed" instead of our status. 4096 characters of a
# non-ASCII message (or a model name a client sent, echoed) are up to 36 KiB.
MAX_DETAILS_SENT = 6144


def code_for(http_status: int) -> grpc.StatusCode:
    if http_status in _CODES:
        return _CODES[http_status]
    if 200 <= http_status < 300:
        return grpc.StatusCode.OK
    if 400 <= http_status < 500:
        return grpc.StatusCode.FAILED_PRECONDITION
    if 500 <= http_status < 600:
        return grpc.StatusCode.INTERNAL
    return grpc.StatusCode.UNKNOWN


class RpcError(Exception):
    """A gRPC status to answer: raised inside an RPC, turned into ``context.abort``."""

    def __init__(
        self,
        code: grpc.StatusCode,
        details: str,
        http_status: int = 500,
        metadata: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__(details)
        self.code = code
        self.details = bounded_details(details)
        self.http_status = http_status  # for the metrics and the access log
        self.metadata = metadata  # trailing metadata (a 503's retry-after)


def bounded_details(details: str) -> str:
    """``details`` cut to ``MAX_DETAILS`` characters and ``MAX_DETAILS_SENT`` bytes as sent."""
    details = details[:MAX_DETAILS]
    if len(details) <= MAX_DETAILS_SENT // 9:  # 9 bytes a character at most (%XX%XX%XX)
        return details
    sent = 0
    for i, ch in enumerate(details):
        plain = " " <= ch <= "~" and ch != "%"
        sent += 1 if plain else 3 * len(ch.encode("utf-8", "surrogatepass"))
        if sent > MAX_DETAILS_SENT:
            return details[:i]
    return details


def from_error(exc: TorchbayError, *, oip: bool = False) -> RpcError:
    """``exc`` as a status; ``oip``: with Triton's wording (the OIP service's answers)."""
    retry = exc.headers.get("retry-after")
    metadata = (("retry-after", retry),) if retry else ()
    code = _BY_ERROR_CODE.get(exc.code) or code_for(exc.status)
    return RpcError(code, exc.oip_text if oip else exc.message, exc.status, metadata)


def succeeded(status: object) -> bool:
    """A handler's answer that is a success: any 2xx (a 201 or 202 it set too)."""
    return type(status) is int and 200 <= status < 300


def from_response(status: int, body: bytes) -> RpcError:
    """A handler's error response (``{"code","type","message"}`` or OIP's ``{"error"}``) as a
    status: its HTTP status mapped, its message as the details. A status that is no HTTP
    answer (a 1xx, 999) is INTERNAL, as REST answers it 500 (http/inference.py)."""
    if type(status) is not int or not 200 <= status <= 599:
        return RpcError(grpc.StatusCode.INTERNAL, "The model answered with an invalid HTTP status")
    return RpcError(code_for(status), error_message(status, body), status)


def error_message(status: int, body: bytes) -> str:
    try:
        data: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        data = None
    if isinstance(data, dict):
        for key in ("message", "error"):
            if isinstance(data.get(key), str) and data[key]:
                return data[key]
    text = body.decode("utf-8", "replace").strip() if body else ""
    return text or f"The model answered HTTP status {status}"


def answer_error(context: grpc.aio.ServicerContext, error: RpcError) -> None:
    """End a unary call with ``error`` as its status, its handler then returning None (gRPC
    discards a response under a non-OK code). Unlike ``abort`` it raises nothing: gRPC keeps an
    abort's exception in a reference cycle with the call's state and frames, left to the garbage
    collector, a cost per refused call under overload."""
    context.set_code(error.code)
    context.set_details(error.details)
    if error.metadata:
        context.set_trailing_metadata(error.metadata)


async def abort(context: grpc.aio.ServicerContext, error: RpcError) -> NoReturn:
    await context.abort(error.code, error.details, error.metadata)
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover
