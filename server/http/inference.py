"""The inference listener (default 8080): TorchServe's inference API (``/ping``,
``/predictions``, ``/explanations``), KServe v1 (``kserve_v1.py``) and the Open Inference
Protocol (KServe v2) REST endpoints, as one raw ASGI app. Its routes are
``route_table.INFERENCE_ROUTES``: the dispatch below and the OpenAPI document (``OPTIONS /``,
``/openapi.json``) both come from it.

The frontend never decodes bodies: raw bytes and headers go to the worker, which parses them.
It does check what comes back before handing it to the HTTP server: a status outside 200..599,
a header that is not a valid HTTP field (name not a token; CR, LF or NUL in a value; not
latin-1) or headers past ``MAX_HANDLER_HEADER_BYTES`` in all is answered 500 with an error body,
never passed on (uvicorn would send nothing, a client could read nothing); a 204 or 304 goes out
without the body the handler gave it.

Every request is read with ``ModelVersion.admit_reader`` (then ``rest``): a handler that streams
parts is answered chunked (TorchServe) or as server-sent events (the generate extension), see
streaming.py.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from torchbay.server.errors import HandlerFailed, ServiceUnavailable, TorchbayError
from torchbay.server.http import disconnect, early, invocations, kserve_v1, streaming
from torchbay.server.http.asgi import (
    Answer,
    Receive,
    Scope,
    Send,
    dumps,
    header,
    lifespan,
    read_body,
    send_bytes,
    send_error,
    send_json,
)
from torchbay.server.http.invocations import replay
from torchbay.server.http.openapi import ModelApi
from torchbay.server.http.route_table import INFERENCE_ROUTES
from torchbay.server.http.routes import Route, Router
from torchbay.server.http.shm import SharedMemoryApi
from torchbay.server.http.triton import TritonApi
from torchbay.server.http.wfpredict import WorkflowPredict
from torchbay.server.plane import DataPlane, ModelVersion, WireRequest, WireResponse, join_headers
from torchbay.server.workflows.manager import Workflows

log = logging.getLogger("torchbay.inference")

Match = re.Match[str]  # a route's path match: its groups are the path's parameters
# Raises Unauthorized when the request may not use this API; see server.auth.
AuthHook = Callable[[Scope, str], None]
# Answers a request from its first response and the rest of its stream; the status it sent.
Respond = Callable[
    [Scope, Receive, Send, ModelVersion, WireRequest, WireResponse, streaming.Parts],
    Awaitable[int],
]


class InferenceApp:
    def __init__(
        self,
        plane: DataPlane,
        *,
        max_request_size: int,
        authorize: AuthHook | None = None,
        openapi: dict[str, Any] | None = None,
        workflows: Workflows | None = None,
    ) -> None:
        self.plane = plane
        self.max_request_size = max_request_size
        self.authorize = authorize
        self.openapi = openapi or {"openapi": "3.0.1", "info": {"title": "torchbay inference"}}
        self._openapi_body = dumps(self.openapi)  # an open route: serialized once (~1.2 ms)
        self._ids = itertools.count(1)
        self._id_prefix = f"{os.getpid():x}-{int(time.time()):x}-"
        # Metadata, statistics, model configuration and repository: http/triton.py.
        self.triton = TritonApi(plane, authorize=authorize)
        shm = SharedMemoryApi(plane, authorize=authorize)  # shared-memory regions: http/shm.py
        # TorchServe's /wfpredict (http/wfpredict.py) over the server's workflows.
        self.workflows = workflows or Workflows(plane)
        wf = WorkflowPredict(self.workflows, max_request_size=max_request_size, authorize=authorize)
        v1 = kserve_v1.KServeV1(self)  # KServe v1: predict, explain, liveness, readiness
        api = ModelApi(plane, self.openapi, authorize)  # OPTIONS /predictions/{m}: http/openapi
        endpoints = {
            r.endpoint: getattr(self, "_" + r.endpoint, None)
            or getattr(self.triton, r.endpoint, None)
            or getattr(shm, r.endpoint, None)
            or getattr(v1, r.endpoint, None)
            or getattr(api, r.endpoint, None)
            or getattr(wf, r.endpoint)
            for r in INFERENCE_ROUTES
        }
        self.router = Router(INFERENCE_ROUTES, endpoints, oip_prefix="/v2")
        # What this listener serves, named as the plane's operations: its OIP extensions.
        self.operations = frozenset(_OPERATION.get(e, e) for e in endpoints)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await lifespan(receive, send)
            return
        route: Route | None = None
        try:
            found = scope.pop(early.ROUTED, None)  # at_headers' (this request's) route
            route, endpoint, match = found or self.router.resolve(scope["path"], scope["method"])
            await endpoint(scope, receive, send, match)
        except TorchbayError as exc:
            oip = route.oip if route is not None else scope["path"].startswith("/v2")
            await send_error(send, exc, oip=oip)
            # Answered. Its frames hold the request's future, which holds this error: a cycle
            # per refused or expired request, left to the garbage collector, unless cut here.
            exc.__traceback__ = None

    def at_headers(self, scope: Scope) -> Answer | None:
        """The 503 to send before the request's ASGI task exists, or None (server.http.early)."""
        return early.at_headers(self, scope)

    # -- TorchServe API -----------------------------------------------------------------------

    async def _describe(self, scope: Scope, receive: Receive, send: Send, match: Match) -> None:
        await send_bytes(send, 200, self._openapi_body)

    async def _ping(self, scope: Scope, receive: Receive, send: Send, match: Match) -> None:
        healthy = self.plane.healthy()
        await send_json(
            send, 200 if healthy else 500, {"status": "Healthy" if healthy else "Unhealthy"}
        )

    async def _predict(self, scope: Scope, receive: Receive, send: Send, match: Match) -> None:
        await self._predictions(scope, receive, send, match, None)

    async def _explain(self, scope: Scope, receive: Receive, send: Send, match: Match) -> None:
        await self._predictions(scope, receive, send, match, {"explain": "True"})

    async def _predictions(
        self, scope: Scope, receive: Receive, send: Send, match: Match, extra: dict[str, str] | None
    ) -> None:
        """TorchServe: ``{model}[/{version}][/extra/path]``; extra segments reach the handler as
        the ``url_path`` header, ``/explanations`` as ``explain: True``."""
        url_path = match.groupdict().get("url_path")
        if url_path is not None:
            # Header values are latin-1: percent-encode what is not ASCII (the path was decoded).
            extra = {**(extra or {}), "url_path": quote(url_path, safe=_PATH_SAFE)}
        name, version = early.ts_model(match)
        await self._infer(scope, receive, send, name, version, "predict", extra)

    async def _invocations(self, scope: Scope, receive: Receive, send: Send, m: Match) -> None:
        """SageMaker's ``POST /invocations``: the model named as http/invocations.py says."""
        named, form = invocations.named(scope), None
        if invocations.is_form(scope) and self.plane.invocation_reads_form(named):
            if self.authorize is not None:
                self.authorize(scope, "inference")  # 401 before the body is read
            body = await read_body(scope, receive, self.max_request_size)
            # A form's parse is pure Python, seconds for a body of many small fields or lines:
            # in a thread, the event loop keeps serving meanwhile.
            form = await asyncio.to_thread(invocations.form_field, scope, body, "model_name")
            receive = replay(body, receive)
        choose = lambda: self.plane.invocation_model(named, form)  # noqa: E731
        await self._infer(scope, receive, send, "", None, "predict", choose=choose)

    async def _invoke(self, scope: Scope, receive: Receive, send: Send, match: Match) -> None:
        """SageMaker's ``POST /models/{model}/invoke``: the model's default version."""
        await self._infer(scope, receive, send, match["model_name"], None, "predict")

    async def _infer(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        name: str,
        version: str | None,
        protocol: str,
        extra: dict[str, str] | None = None,
        respond: Respond | None = None,
        choose: Callable[[], str] | None = None,
        check: Callable[[Scope, bytes], None] | None = None,
    ) -> None:
        """The hot path: admit one request to its model's queue, answer its response (or its
        stream of parts, see streaming.py) with ``respond``; the plane records it. ``choose``
        names the model once the key is checked (``/invocations``: 401 before 400); ``check``
        refuses a body the endpoint cannot take before it is queued."""
        with self.plane.exchange(scope, name, version) as ex:
            if self.authorize is not None:
                self.authorize(scope, "inference")
            if choose is not None:
                ex.name = choose()
            mv = ex.resolve()  # 503 from the headers alone: the body is never read
            body = await read_body(scope, receive, self.max_request_size)
            if check is not None:
                check(scope, body)
            wire = self._wire_request(scope, body, protocol, extra)
            item = ex.admit(wire)
            # A part, or the response when nothing streams; None when the client left.
            first = await disconnect.first_answer(scope, ex, item.future)
            if first is None:
                return
            rest = ex.rest(item)
            try:
                if protocol == "v2":  # OIP's infer answers once: a streaming handler is refused
                    ex.answers_once(first, "HTTP end point")
                answer = respond or self._respond
                ex.status = await answer(scope, receive, send, mv, wire, first, rest)
            finally:
                await rest.aclose()

    async def _respond(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        mv: ModelVersion,
        wire: WireRequest,
        response: WireResponse,
        parts: streaming.Parts,
    ) -> int:
        """TorchServe's answer: the response, or chunked when the handler streams parts."""
        content_type, headers = _checked_response(response, wire.request_id)
        status = response.status
        if response.partial and status not in (204, 304):
            headers.insert(0, (b"content-type", content_type))
            # (an HTTP/1.0 client: no chunks)
            send = streaming.whole(send, scope, mv.settings.max_response_size)
            await streaming.send_chunked(send, receive, response, parts, headers)
        elif status in (204, 304):
            # No body allowed: one sent anyway would be read as the start of the next
            # response on this keep-alive connection.
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
        else:
            await send_bytes(send, status, response.body, content_type, headers)
        return status

    def _wire_request(
        self, scope: Scope, body: bytes, protocol: str, extra: dict[str, str] | None = None
    ) -> WireRequest:
        pairs: list[tuple[bytes, bytes]] = scope["headers"]
        if extra:
            pairs = [
                *pairs,
                *((k.encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()),
            ]
        content_type = header(scope, b"content-type")
        return WireRequest(
            request_id=self._id_prefix + str(next(self._ids)),
            body=body,
            content_type=content_type.decode("latin-1") if content_type else "",
            query=scope.get("query_string", b"").decode("latin-1"),
            protocol=protocol,
            raw_headers=join_headers(pairs),  # decoded by the worker, not here
        )

    # -- Open Inference Protocol ----------------------------------------------------------------

    async def _server_metadata(self, scope: Scope, receive: Receive, send: Send, m: Match) -> None:
        await send_json(send, 200, self.plane.server_metadata(self.operations))

    async def _live(self, scope: Scope, receive: Receive, send: Send, match: Match) -> None:
        await send_json(send, 200, {"live": True})

    async def _ready(self, scope: Scope, receive: Receive, send: Send, match: Match) -> None:
        ready = self.plane.ready()
        await send_json(send, 200 if ready else 503, {"ready": ready})

    async def _v2_infer(self, scope: Scope, receive: Receive, send: Send, match: Match) -> None:
        name, version = early.v2_model(match)
        await self._infer(scope, receive, send, name, version, "v2")

    async def _generate(self, scope: Scope, receive: Receive, send: Send, match: Match) -> None:
        await self._generated(scope, receive, send, match, streaming.respond_generate)

    async def _generate_stream(
        self, scope: Scope, receive: Receive, send: Send, match: Match
    ) -> None:
        await self._generated(scope, receive, send, match, streaming.respond_generate_stream)

    async def _generated(
        self, scope: Scope, receive: Receive, send: Send, match: Match, answer: Callable
    ) -> None:
        """The generate extension: its JSON object to the handler, the answer as one JSON
        object or as server-sent events (``answer``)."""
        respond, scope = _generated(answer), streaming.as_json(scope)
        name, version = early.v2_model(match)
        await self._infer(
            scope,
            receive,
            send,
            name,
            version,
            "predict",
            respond=respond,
            check=streaming.json_object,
        )

    async def _model_ready(self, scope: Scope, receive: Receive, send: Send, m: Match) -> None:
        if self.authorize is not None:
            self.authorize(scope, "inference")
        mv, ready = self.plane.model_ready(*early.v2_model(m))
        await send_json(send, 200 if ready else 503, {"name": mv.name, "ready": ready})


# An endpoint's plane operation, where the names differ (the rest are the same name).
_OPERATION = {"v2_infer": "infer"}


def _generated(answer: Callable[..., Awaitable[int]]) -> Respond:
    """A generate extension answer (streaming.respond_generate[_stream]) as a ``Respond``."""

    async def respond(
        scope: Scope,
        receive: Receive,
        send: Send,
        mv: ModelVersion,
        wire: WireRequest,
        first: WireResponse,
        parts: streaming.Parts,
    ) -> int:
        send = streaming.whole(send, scope, mv.settings.max_response_size)  # (HTTP/1.0)
        return await answer(send, receive, first, parts, mv)

    return respond


# RFC 3986 path characters kept as they are in the url_path header.
_PATH_SAFE = "/:@!$&'()*+,;=-._~"
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(rb"[\r\n\x00]")
# Framing is the frontend's: a handler's own copies would contradict the body it sends.
_FRAMING = frozenset((b"content-length", b"transfer-encoding", b"connection"))
# The most header bytes a handler may set on one response: what common clients read (h11's and
# Node.js's defaults stop at 16 KiB, httpx at 100 KiB; nginx's proxy buffer is 4-8 KiB). Past
# it a client could read no answer at all, so the request is answered 500 instead.
MAX_HANDLER_HEADER_BYTES = 16 * 1024


def _checked_response(
    response: WireResponse, request_id: str
) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The content type and headers to send, or HandlerFailed (500) when the handler's status or
    headers are not valid HTTP (logged with the request id and the offending field)."""
    status = response.status
    if type(status) is not int or not 200 <= status <= 599:
        log.error(
            "request %s: the handler answered with the invalid HTTP status %r; answered 500",
            request_id,
            status,
        )
        raise HandlerFailed("The model answered with an invalid HTTP status")
    try:
        content_type = response.content_type.encode("latin-1")
        pairs = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.items()]
    except (UnicodeEncodeError, AttributeError):
        log.error(
            "request %s: the handler answered with a header that is not latin-1 text; answered 500",
            request_id,
        )
        raise HandlerFailed("The model answered with an invalid HTTP header") from None
    bad = [(b"content-type", content_type)] if _BAD_VALUE.search(content_type) else []
    bad += [(k, v) for k, v in pairs if not _TOKEN.fullmatch(k) or _BAD_VALUE.search(v)]
    if bad:
        log.error(
            "request %s: the handler answered with the invalid header %r: %r; answered 500",
            request_id,
            bad[0][0][:100],
            bad[0][1][:100],
        )
        raise HandlerFailed("The model answered with an invalid HTTP header")
    size = sum(len(k) + len(v) + 4 for k, v in pairs)  # "name: value\r\n"
    if size > MAX_HANDLER_HEADER_BYTES:
        log.error(
            "request %s: the handler set %d header bytes (at most %d); answered 500",
            request_id,
            size,
            MAX_HANDLER_HEADER_BYTES,
        )
        raise HandlerFailed("The model answered with too many HTTP header bytes")
    headers = []
    for name, value in pairs:
        if name.lower() not in _FRAMING:
            headers.append((name, value))
    return content_type, headers


__all__ = ["InferenceApp", "ServiceUnavailable"]
