"""The inference listener (default 8080): TorchServe's inference API and the Open Inference
Protocol (KServe v2) REST endpoints, as one raw ASGI app.

    GET  /ping                                   200 Healthy | 500 Unhealthy
    POST|PUT /predictions/{model}[/{version}]    TorchServe predictions (raw, multipart, JSON)
    POST /explanations/{model}[/{version}]       same, with the ``explain`` header set
    GET  /v2  /v2/health/live  /v2/health/ready
    GET  /v2/models/{m}[/versions/{v}]           model metadata
    GET  /v2/models/{m}[/versions/{v}]/ready
    POST /v2/models/{m}[/versions/{v}]/infer     OIP JSON tensors in and out
    POST /v1/models/{m}:predict                  KServe v1 {"instances"} (server.kserve_v1)
    OPTIONS /  GET /api-description  GET /openapi.json   this API's OpenAPI description

The frontend never decodes bodies: raw bytes and headers go to the worker, which parses them.
It does check what comes back before handing it to the HTTP server: a status outside 200..599
or a header that is not a valid HTTP field (name not a token; CR, LF or NUL in a value; not
latin-1) is answered 500 with an error body, never passed on (uvicorn would send nothing);
a 204 or 304 goes out without the body the handler gave it.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote

from torchbay.server.errors import (
    HandlerFailed,
    MethodNotAllowed,
    NotFound,
    ServiceUnavailable,
    TorchbayError,
)
from torchbay.server.http import kserve_v1
from torchbay.server.http.asgi import (
    Receive,
    Scope,
    Send,
    header,
    read_body,
    send_bytes,
    send_error,
    send_json,
)
from torchbay.server.observe.logs import RequestHook
from torchbay.server.serving import protocol as p
from torchbay.server.serving.model import ModelStatus, ModelVersion
from torchbay.server.serving.queue import Pending
from torchbay.server.serving.registry import ModelRegistry

log = logging.getLogger("torchbay.inference")

# Raises Unauthorized when the request may not use this API; see server.auth.
AuthHook = Callable[[Scope, str], None]


class InferenceApp:
    def __init__(
        self,
        registry: ModelRegistry,
        *,
        max_request_size: int,
        server_version: str,
        on_request: RequestHook | None = None,
        authorize: AuthHook | None = None,
        openapi: dict[str, Any] | None = None,
    ) -> None:
        self.registry = registry
        self.max_request_size = max_request_size
        self.server_version = server_version
        self.on_request = on_request
        self.authorize = authorize
        self.openapi = openapi or {"openapi": "3.0.1", "info": {"title": "torchbay inference"}}
        self._ids = itertools.count(1)
        self._id_prefix = f"{os.getpid():x}-{int(time.time()):x}-"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await _lifespan(receive, send)
            return
        path: str = scope["path"]
        method: str = scope["method"]
        oip = path.startswith("/v2")
        try:
            if path.startswith("/predictions/") and method in ("POST", "PUT"):
                await self._predict(scope, receive, send, path[len("/predictions/") :], False)
            elif path.startswith("/explanations/") and method == "POST":
                await self._predict(scope, receive, send, path[len("/explanations/") :], True)
            elif oip:
                await self._v2(scope, receive, send, path, method)
            elif path.startswith(kserve_v1.PREFIX) and method == "POST":
                await kserve_v1.predict(self, scope, receive, send)
            elif path == "/ping" and method == "GET":
                await self._ping(send)
            elif path in ("/", "/api-description", "/openapi.json") and method in (
                "OPTIONS",
                "GET",
            ):
                if path == "/" and method == "GET":
                    raise NotFound("Requested resource is not found, please refer to API document.")
                await send_json(send, 200, self.openapi)
            else:
                raise NotFound("Requested resource is not found, please refer to API document.")
        except TorchbayError as exc:
            await send_error(send, exc, oip=oip)

    # -- TorchServe API -----------------------------------------------------------------------

    async def _ping(self, send: Send) -> None:
        healthy = all(
            mv.healthy
            for name, default in self.registry.defaults.items()
            for mv in (self.registry.models[name][default],)
        )
        await send_json(
            send, 200 if healthy else 500, {"status": "Healthy" if healthy else "Unhealthy"}
        )

    async def _predict(
        self, scope: Scope, receive: Receive, send: Send, rest: str, explain: bool
    ) -> None:
        """TorchServe: ``{model}[/{version}][/extra/path]``; extra segments reach the handler as
        the ``url_path`` header, ``/explanations`` as ``explain: True``."""
        parts = rest.split("/")
        name = unquote(parts[0])
        version = unquote(parts[1]) if len(parts) > 1 and parts[1] else None
        extra = {"explain": "True"} if explain else {}
        if len(parts) > 2:
            # Header values are latin-1: percent-encode what is not ASCII (the path was decoded).
            extra["url_path"] = quote("/".join(parts[2:]), safe=_PATH_SAFE)
        await self._infer(scope, receive, send, name, version, "predict", extra)

    async def _infer(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        name: str,
        version: str | None,
        protocol: str,
        extra: dict[str, str] | None = None,
    ) -> None:
        """The hot path: admit one request to its model's queue, await its one response."""
        started = time.perf_counter()
        mv: ModelVersion | None = None
        item: Pending[p.WireRequest, p.WireResponse] | None = None
        status = 500
        try:
            if self.authorize is not None:
                self.authorize(scope, "inference")
            mv = self.registry.resolve(name, version)
            body = await read_body(scope, receive, self.max_request_size)
            wire = self._wire_request(scope, body, protocol, extra)
            item = mv.admit(wire)
            mv.inflight += 1
            try:
                response = await item.future
            finally:
                mv.inflight -= 1
            content_type, headers = _checked_response(response, wire.request_id)
            status = response.status
            if status in (204, 304):
                # No body allowed: one sent anyway would be read as the start of the next
                # response on this keep-alive connection.
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": b""})
            else:
                await send_bytes(send, status, response.body, content_type, headers)
        except TorchbayError as exc:
            status = exc.status
            raise
        finally:
            if self.on_request is not None:
                queue_s = None
                if item is not None and item.dispatched is not None:
                    queue_s = item.dispatched - item.arrival
                self.on_request(
                    scope, name, version, status, time.perf_counter() - started, queue_s, mv
                )

    def _wire_request(
        self, scope: Scope, body: bytes, protocol: str, extra: dict[str, str] | None = None
    ) -> p.WireRequest:
        pairs: list[tuple[bytes, bytes]] = scope["headers"]
        if extra:
            pairs = [
                *pairs,
                *((k.encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()),
            ]
        content_type = header(scope, b"content-type")
        return p.WireRequest(
            request_id=self._id_prefix + str(next(self._ids)),
            body=body,
            content_type=content_type.decode("latin-1") if content_type else "",
            query=scope.get("query_string", b"").decode("latin-1"),
            protocol=protocol,
            raw_headers=p.join_headers(pairs),  # decoded by the worker, not here
        )

    # -- Open Inference Protocol ----------------------------------------------------------------

    async def _v2(self, scope: Scope, receive: Receive, send: Send, path: str, method: str) -> None:
        parts = [unquote(s) for s in path.strip("/").split("/")]  # ["v2", ...]
        if parts == ["v2"] and method == "GET":
            await send_json(
                send, 200, {"name": "torchbay", "version": self.server_version, "extensions": []}
            )
            return
        if parts[:2] == ["v2", "health"] and len(parts) == 3 and method == "GET":
            if parts[2] == "live":
                await send_json(send, 200, {"live": True})
                return
            if parts[2] == "ready":
                ready = self._all_ready()
                await send_json(send, 200 if ready else 503, {"ready": ready})
                return
        if len(parts) >= 3 and parts[1] == "models":
            name, version, action = _parse_v2_model_path(parts[2:])
            if action == "infer" and method == "POST":
                await self._infer(scope, receive, send, name, version, "v2")
                return
            if method == "GET" and action in ("", "ready"):
                if self.authorize is not None:
                    self.authorize(scope, "inference")
                mv = self.registry.resolve(name, version)
                if action == "ready":
                    ready = mv.status is ModelStatus.READY
                    await send_json(send, 200 if ready else 503, {"name": name, "ready": ready})
                else:
                    await send_json(send, 200, self._v2_metadata(mv))
                return
            if action in ("", "ready", "infer"):
                raise MethodNotAllowed(f"{method} is not allowed on {path}")
        raise NotFound(f"No route for {method} {path}")

    def _all_ready(self) -> bool:
        versions = self.registry.all_versions()
        return bool(versions) and all(mv.status is ModelStatus.READY for mv in versions)

    def _v2_metadata(self, mv: ModelVersion) -> dict[str, Any]:
        info = getattr(mv.manifest, "torchbay", None)
        fmt = getattr(info, "format", None) or "torchscript"
        inputs: list[dict[str, Any]] = []
        if info is not None and getattr(info, "input_shape", None):
            dtype = {"float32": "FP32", "float16": "FP16", "bfloat16": "BF16", "int64": "INT64"}
            inputs.append(
                {
                    "name": "input0",
                    "datatype": dtype.get(getattr(info, "input_dtype", "float32"), "FP32"),
                    "shape": [-1, *info.input_shape],
                }
            )
        return {
            "name": mv.name,
            "versions": sorted(self.registry.models.get(mv.name, {})),
            "platform": f"pytorch_{fmt}",
            "inputs": inputs,
            "outputs": [],
        }


def _parse_v2_model_path(rest: list[str]) -> tuple[str, str | None, str]:
    """``[m]``, ``[m, "ready"]``, ``[m, "versions", v, "infer"]`` -> (m, v, action)."""
    name = rest[0]
    tail = rest[1:]
    version = None
    if len(tail) >= 2 and tail[0] == "versions":
        version, tail = tail[1], tail[2:]
    if len(tail) > 1:
        return name, version, "/".join(tail)
    return name, version, tail[0] if tail else ""


# RFC 3986 path characters kept as they are in the url_path header.
_PATH_SAFE = "/:@!$&'()*+,;=-._~"
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(rb"[\r\n\x00]")
# Framing is the frontend's: a handler's own copies would contradict the body it sends.
_FRAMING = frozenset((b"content-length", b"transfer-encoding", b"connection"))


def _checked_response(
    response: p.WireResponse, request_id: str
) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The content type and headers to send, or HandlerFailed (500) when the handler's status or
    headers are not valid HTTP (logged with the request id and the offending field)."""
    status = response.status
    if type(status) is not int or not 200 <= status <= 599:
        log.error("request %s: the handler answered with the invalid HTTP status %r; "
                  "answered 500", request_id, status)  # fmt: skip
        raise HandlerFailed("The model answered with an invalid HTTP status")
    try:
        content_type = response.content_type.encode("latin-1")
        pairs = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.items()]
    except (UnicodeEncodeError, AttributeError):
        log.error("request %s: the handler answered with a header that is not latin-1 text; "
                  "answered 500", request_id)  # fmt: skip
        raise HandlerFailed("The model answered with an invalid HTTP header") from None
    bad = [(b"content-type", content_type)] if _BAD_VALUE.search(content_type) else []
    bad += [(k, v) for k, v in pairs if not _TOKEN.fullmatch(k) or _BAD_VALUE.search(v)]
    if bad:
        log.error("request %s: the handler answered with the invalid header %r: %r; "
                  "answered 500", request_id, bad[0][0][:100], bad[0][1][:100])  # fmt: skip
        raise HandlerFailed("The model answered with an invalid HTTP header")
    headers = []
    for name, value in pairs:
        if name.lower() not in _FRAMING:
            headers.append((name, value))
    return content_type, headers


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


__all__ = ["InferenceApp", "ServiceUnavailable"]
