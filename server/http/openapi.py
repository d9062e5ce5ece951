"""OpenAPI 3.0 descriptions of the three ports, served by ``OPTIONS /`` and ``GET /openapi.json``
on each, as TorchServe's ``OPTIONS /`` API description does.

The shared pieces (status texts, error schemas, each port's generic statuses); the generator
that renders a raw listener's route table (``routes``) as its document; ``documented``, the
statuses a FastAPI management route declares, and the small post-process of FastAPI's document;
and the metrics port's wrapper that dispatches on its table. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchbay.server.errors import BadRequest, TorchbayError
from torchbay.server.http.asgi import (
    ASGIApp,
    Receive,
    Scope,
    Send,
    dumps,
    lifespan,
    send_bytes,
    send_error,
    send_json,
)
from torchbay.server.http.early import ts_model
from torchbay.server.http.route_table import INFERENCE_ROUTES, METRICS_ROUTES
from torchbay.server.http.routes import Route, Router
from torchbay.server.plane import DataPlane

_ERROR = {
    "type": "object",
    "description": "TorchServe's error body; ``code`` repeats the HTTP status",
    "required": ["code", "type", "message"],
    "properties": {
        "code": {"type": "integer"},
        "type": {"type": "string"},
        "message": {"type": "string"},
    },
}
_OIP_ERROR = {
    "type": "object",
    "description": "Open Inference Protocol error body (errors from the worker also carry "
    "TorchServe's code, type and message)",
    "required": ["error"],
    "properties": {
        "error": {"type": "string"},
        "code": {"type": "integer"},
        "type": {"type": "string"},
        "message": {"type": "string"},
    },
}
_BEARER = [{"bearer": []}]

# What each status means, for every route that can answer it.
STATUS_TEXT = {
    200: "OK",
    202: "Accepted: the work goes on in the background",
    206: "Partial: fewer workers started than asked for",
    400: "Bad input (a malformed request, parameter, body or tensor)",
    401: "Missing, wrong or expired key (token authorization on)",
    403: "Forbidden: a URL not in allowed_urls, or unregistering the default version of a "
    "model that has others",
    404: "Unknown route, model or version",
    405: "Method not allowed (or the model API is disabled)",
    408: "The client was too slow sending its request",
    409: "Already registered",
    413: "Request body (or download) too large",
    422: "The model cannot process this input (a shape or type it does not take)",
    431: "Request headers too large",
    500: "Internal error: the handler failed (or a bug of ours)",
    501: "Not implemented: a handler without explanations (/explanations or an explain header), "
    "a handler that streams on OIP infer, or a transfer coding other than chunked",
    503: "Queue full, no worker, or shutting down; see Retry-After",
    504: "Timed out",
    507: "No room to load the model: out of memory, or max_loaded_models full of pinned models",
}
# Statuses any request to a port may get, whatever its route: the HTTP layer's (malformed
# request, slow client, oversized headers, a transfer coding it does not read) and the routers'
# (no such route or method).
INFERENCE_GENERIC = (400, 404, 405, 408, 413, 431, 501)
MANAGEMENT_GENERIC = (400, 404, 405, 408, 413, 431, 500, 501)
METRICS_GENERIC = (400, 404, 405, 408, 431, 501)


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _answer(description: str, schema: dict[str, Any] | str) -> dict[str, Any]:
    if isinstance(schema, str):  # a content type
        return {"description": description, "content": {schema: {}}}
    return _json(schema, description)


def _errors(*codes: int, oip: bool = False) -> dict[str, Any]:
    ref = {"$ref": "#/components/schemas/" + ("OIPError" if oip else "Error")}
    return {str(c): _json(ref, STATUS_TEXT[c]) for c in codes}


def operation(route: Route, generic: tuple[int, ...]) -> dict[str, Any]:
    """``route``'s OpenAPI operation: its answers, its errors, then the port's generic ones."""
    responses = {code: _answer(*answer) for code, answer in route.answers.items()}
    for code, response in _errors(*route.errors, *generic, oip=route.oip).items():
        responses.setdefault(code, response)
    op: dict[str, Any] = {"summary": route.summary}
    if route.description:
        op["description"] = route.description
    if route.auth:
        op["security"] = _BEARER
    params = [
        {"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
        for n in route.params()
    ]
    if params or route.query:
        op["parameters"] = [*params, *route.query]
    if route.body is not None:
        op["requestBody"] = route.body
    op["responses"] = responses
    return op


def routes_document(
    title: str, version: str, routes: tuple[Route, ...], generic: tuple[int, ...]
) -> dict[str, Any]:
    """The OpenAPI document of a route table (the same table the listener dispatches on)."""
    paths: dict[str, Any] = {}
    for route in routes:
        item = paths.setdefault(route.path, {})
        item[route.method.lower()] = operation(route, generic)
        if route.suffix:
            item["x-torchbay-path-suffix"] = True  # /predictions/m/v/more/segments -> url_path
        if route.any_method:
            item["x-torchbay-any-method"] = True  # other methods answered so (TorchServe)
    return _document(title, version, paths, generic)


def model_document(
    document: dict[str, Any],
    name: str,
    placeholder: str = "{model_name}",
    title: str = "RESTful API for",
) -> dict[str, Any]:
    """TorchServe's ``OPTIONS /predictions/{m}`` (and, with the management document, its
    ``placeholder`` and ``title``, ``OPTIONS /models/{m}``): ``document``'s operations on one
    model (``placeholder`` filled in), titled as TorchServe titles it."""
    paths = {
        path.replace(placeholder, name): item
        for path, item in document["paths"].items()
        if placeholder in path
    }
    info = {**document["info"], "title": f"{title}: {name}"}
    return {**document, "info": info, "paths": paths}


class ModelApi:
    """The inference listener's ``OPTIONS /predictions/{m}[/{v}]`` (and ``/explanations``):
    :func:`model_document` of a model the server has; 404 for one it lacks, as TorchServe."""

    def __init__(
        self,
        plane: DataPlane,
        document: dict[str, Any],
        authorize: Callable[[Scope, str], None] | None,
    ) -> None:
        self.plane, self.document, self.authorize = plane, document, authorize

    async def model_api(self, scope: Scope, receive: Receive, send: Send, match: Any) -> None:
        if self.authorize is not None:
            self.authorize(scope, "inference")
        mv = self.plane.model(*ts_model(match))
        await send_json(send, 200, model_document(self.document, mv.name))


def inference_openapi(server_version: str) -> dict[str, Any]:
    """The inference port (TorchServe's inference API and the Open Inference Protocol)."""
    return routes_document(
        "torchbay inference API", server_version, INFERENCE_ROUTES, INFERENCE_GENERIC
    )


def metrics_openapi(server_version: str) -> dict[str, Any]:
    """The metrics port: Prometheus text on ``/metrics`` (no key needed)."""
    return routes_document("torchbay metrics API", server_version, METRICS_ROUTES, METRICS_GENERIC)


_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def _components() -> dict[str, Any]:
    return {
        "schemas": {"Error": _ERROR, "OIPError": _OIP_ERROR},
        "securitySchemes": {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "A key from the server's key file (key_file.json)",
            }
        },
    }


def _document(
    title: str, version: str, paths: dict[str, Any], generic: tuple[int, ...]
) -> dict[str, Any]:
    return {
        "openapi": "3.0.1",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": _components(),
        # Statuses any request may get, routed or not (see INFERENCE_GENERIC).
        "x-torchbay-generic-responses": [str(c) for c in generic],
    }


# -- the management port: FastAPI's generated document, each route's statuses declared on it --


def documented(*codes: int, auth: bool = True) -> dict[str, Any]:
    """A FastAPI route's ``responses=`` (each of ``codes`` besides 200, with its schema) and,
    with ``auth``, its bearer-key security: ``@router.get(path, **documented(401, 404))``."""
    responses: dict[int | str, Any] = {}
    for code in codes:
        responses.update(_errors(code) if code >= 400 else _status_response(code))
    kwargs: dict[str, Any] = {"responses": responses}
    if auth:
        kwargs["openapi_extra"] = {"security": _BEARER}
    return kwargs


def management_document(document: dict[str, Any]) -> dict[str, Any]:
    """FastAPI's document for the management app, with the port's generic statuses.

    FastAPI lists a 422 the app never sends (bad parameters answer 400, TorchServe's way); this
    drops it (the routes declare their real error responses, described by the Error schema).
    """
    document.setdefault("paths", {}).setdefault("/openapi.json", {}).setdefault(
        "get", {"summary": "This API description", "responses": {}}
    )
    for item in document["paths"].values():
        for method, operation in item.items():
            if method not in _METHODS:
                continue
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            responses.setdefault("200", _status_response(200)["200"])
            for code, response in _errors(*MANAGEMENT_GENERIC).items():
                responses.setdefault(code, response)
    components = document.setdefault("components", {})
    components.setdefault("schemas", {}).pop("HTTPValidationError", None)
    components["schemas"].pop("ValidationError", None)
    for key, value in _components().items():
        components.setdefault(key, {}).update(value)
    document["x-torchbay-generic-responses"] = [str(c) for c in MANAGEMENT_GENERIC]
    return document


def _status_response(code: int) -> dict[str, Any]:
    schema = {"type": "object", "properties": {"status": {"type": "string"}}}
    return {str(code): _json(schema, STATUS_TEXT[code])}


def document_management(app: Any) -> None:
    """Make a FastAPI app's ``openapi()`` (and so /openapi.json, OPTIONS /) answer
    :func:`management_document` of its generated document, built once."""
    generate = app.openapi
    built: list[dict[str, Any]] = []

    def openapi() -> dict[str, Any]:
        if not built:
            built.append(management_document(generate()))
        return built[0]

    app.openapi = openapi


# -- the metrics port's wrapper -------------------------------------------------------------


def with_openapi(app: ASGIApp, document: dict[str, Any]) -> ASGIApp:
    """``app`` (the Prometheus exposition app) behind ``GET|HEAD /metrics`` only, plus
    ``OPTIONS /`` and ``GET|OPTIONS /openapi.json`` answering ``document`` (METRICS_ROUTES).

    Anything else answers a JSON 404 or 405; a query string or Accept header that is not UTF-8
    (which prometheus_client would fail on with a 500) answers 400.
    """

    async def metrics(scope: Scope, receive: Receive, send: Send, match: Any) -> None:
        _check_utf8(scope)
        await app(scope, receive, send)

    body = dumps(document)  # an open route: serialized once

    async def describe(scope: Scope, receive: Receive, send: Send, match: Any) -> None:
        await send_bytes(send, 200, body)

    router = Router(METRICS_ROUTES, {"metrics": metrics, "describe": describe})

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await lifespan(receive, send)
            return
        try:
            _route, endpoint, match = router.resolve(scope["path"], scope["method"])
            await endpoint(scope, receive, send, match)
        except TorchbayError as exc:
            await send_error(send, exc)

    return wrapped


def _check_utf8(scope: Scope) -> None:
    try:
        scope.get("query_string", b"").decode("utf-8")
        for name, value in scope["headers"]:
            if name in (b"accept", b"accept-encoding"):
                value.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("The query string and Accept headers must be UTF-8") from None
