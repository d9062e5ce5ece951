"""OpenAPI 3.0 descriptions of the inference and metrics ports (the management port's comes from
FastAPI). Served by ``OPTIONS /`` and ``GET /openapi.json`` on each port, as TorchServe's
``OPTIONS /`` API description does. Also a tiny ASGI wrapper that adds those two routes to an app
that lacks them (the Prometheus metrics app). Torch-free.
"""

from __future__ import annotations

from typing import Any

from torchbay.server.errors import BadRequest, MethodNotAllowed, NotFound, TorchbayError
from torchbay.server.http.asgi import ASGIApp, Receive, Scope, Send, send_error, send_json
from torchbay.server.http.kserve_v1 import openapi_path

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
    501: "The handler does not support explanations (/explanations or an explain header)",
    503: "Queue full, no worker, or shutting down; see Retry-After",
    504: "Timed out",
}
# Statuses any request to a port may get, whatever its route: the HTTP layer's (malformed
# request, slow client, oversized headers) and the routers' (no such route or method).
INFERENCE_GENERIC = (400, 404, 405, 408, 413, 431)
MANAGEMENT_GENERIC = (400, 404, 405, 408, 413, 431, 500)
METRICS_GENERIC = (400, 404, 405, 408, 431)
_PREDICT_STATUSES = (200, 400, 401, 404, 413, 422, 500, 503, 504)


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int, oip: bool = False) -> dict[str, Any]:
    ref = {"$ref": "#/components/schemas/" + ("OIPError" if oip else "Error")}
    return {str(c): _json(ref, STATUS_TEXT[c]) for c in codes}


def _generic(operation: dict[str, Any], codes: tuple[int, ...], oip: bool = False) -> None:
    """Add the port's generic statuses to ``operation`` (those it does not list already)."""
    responses = operation.setdefault("responses", {})
    for code, response in _errors(*codes, oip=oip).items():
        responses.setdefault(code, response)


def _path_params(*names: str) -> list[dict[str, Any]]:
    return [
        {"name": n, "in": "path", "required": True, "schema": {"type": "string"}} for n in names
    ]


def _predict(version: bool, explain: bool = False) -> dict[str, Any]:
    verb = "Explain" if explain else "Predict"
    codes = (*_PREDICT_STATUSES, 501)  # 501: explain (also the Explain header) unsupported
    return {
        "summary": f"{verb} with the {'given' if version else 'default'} version of a model",
        "description": "Further path segments reach the handler as the url_path header. The "
        "handler may set other statuses of its own.",
        "security": _BEARER,
        "parameters": _path_params("model_name", *(["model_version"] if version else [])),
        "requestBody": {
            "description": "Raw bytes, JSON or multipart form data; passed to the handler as is",
            "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
        },
        "responses": {
            "200": {"description": "The handler's output", "content": {"*/*": {}}},
            **_errors(*codes[1:]),
        },
    }


_READY = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "ready": {"type": "boolean"}},
}


def _v2_model(action: str, version: bool) -> dict[str, Any]:
    params = _path_params("model_name", *(["model_version"] if version else []))
    if action == "infer":
        return {
            "post": {
                "summary": "Open Inference Protocol (KServe v2) inference",
                "security": _BEARER,
                "parameters": params,
                "requestBody": {"content": {"application/json": {"schema": {"type": "object"}}}},
                "responses": {
                    "200": _json({"type": "object"}, "Output tensors"),
                    **_errors(*_PREDICT_STATUSES[1:], oip=True),
                },
            }
        }
    if action == "ready":
        return {
            "get": {
                "summary": "Model readiness",
                "security": _BEARER,
                "parameters": params,
                "responses": {
                    "200": _json(_READY, "Ready"),
                    "503": _json(_READY, "Not ready"),
                    **_errors(401, 404, oip=True),
                },
            }
        }
    return {
        "get": {
            "summary": "Model metadata",
            "security": _BEARER,
            "parameters": params,
            "responses": {"200": _json({"type": "object"}), **_errors(401, 404, oip=True)},
        }
    }


def _describe() -> dict[str, Any]:
    return {
        "options": {
            "summary": "This API description",
            "responses": {"200": _json({"type": "object"})},
        }
    }


def _described(paths: dict[str, Any], *, api_description: bool = False) -> None:
    """``OPTIONS /`` and ``GET|OPTIONS /openapi.json`` (and TorchServe's /api-description)."""
    paths["/"] = _describe()
    for path in ("/openapi.json", "/api-description") if api_description else ("/openapi.json",):
        paths[path] = {"get": _describe()["options"], "options": _describe()["options"]}


def _get(summary: str, responses: dict[str, Any]) -> dict[str, Any]:
    return {"get": {"summary": summary, "responses": responses}}


def inference_openapi(server_version: str) -> dict[str, Any]:
    """The inference port (TorchServe's inference API and the Open Inference Protocol)."""
    health = {"type": "object", "properties": {"status": {"type": "string"}}}
    paths: dict[str, Any] = {}
    _described(paths, api_description=True)
    paths["/ping"] = _get(
        "Health: 200 when every default model version has its minimum workers",
        {"200": _json(health, "Healthy"), "500": _json(health, "Unhealthy")},
    )
    paths["/predictions/{model_name}"] = {"post": _predict(False), "put": _predict(False)}
    paths["/predictions/{model_name}/{model_version}"] = {
        "post": _predict(True),
        "put": _predict(True),
        "x-torchbay-path-suffix": True,  # /predictions/m/v/more/segments -> url_path
    }
    paths["/explanations/{model_name}"] = {"post": _predict(False, explain=True)}
    paths["/explanations/{model_name}/{model_version}"] = {
        "post": _predict(True, explain=True),
        "x-torchbay-path-suffix": True,
    }
    paths["/v2"] = _get("Server metadata", {"200": _json({"type": "object"})})
    paths["/v2/health/live"] = _get("Liveness", {"200": _json({"type": "object"})})
    ready = {"type": "object", "properties": {"ready": {"type": "boolean"}}}
    paths["/v2/health/ready"] = _get(
        "Readiness: every model version has a ready worker",
        {"200": _json(ready, "Ready"), "503": _json(ready, "Not ready")},
    )
    for version in (False, True):
        base = "/v2/models/{model_name}" + ("/versions/{model_version}" if version else "")
        paths[base] = _v2_model("", version)
        paths[base + "/ready"] = _v2_model("ready", version)
        paths[base + "/infer"] = _v2_model("infer", version)
    kserve = openapi_path()  # KServe v1: the first failed instance's status is the answer's
    kserve["post"]["responses"] = {
        "200": kserve["post"]["responses"]["200"],
        **_errors(*_PREDICT_STATUSES[1:]),
    }
    paths["/v1/models/{model_name}:predict"] = kserve
    for path, item in paths.items():
        for operation in _operations(item):
            _generic(operation, INFERENCE_GENERIC, oip=path.startswith("/v2"))
    return _document("torchbay inference API", server_version, paths, INFERENCE_GENERIC)


def metrics_openapi(server_version: str) -> dict[str, Any]:
    """The metrics port: Prometheus text on ``/metrics`` (no key needed)."""
    paths: dict[str, Any] = {}
    _described(paths)
    paths["/metrics"] = {
        "get": {
            "summary": "Prometheus metrics (text exposition format)",
            "parameters": [
                {
                    "name": "name[]",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "array", "items": {"type": "string"}},
                    "description": "Only these metric families",
                }
            ],
            "responses": {"200": {"description": "OK", "content": {"text/plain": {}}}},
        }
    }
    paths["/metrics"]["head"] = {**paths["/metrics"]["get"], "summary": "The same, headers only"}
    for item in paths.values():
        for operation in _operations(item):
            _generic(operation, METRICS_GENERIC)
    return _document("torchbay metrics API", server_version, paths, METRICS_GENERIC)


_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def _operations(item: dict[str, Any]) -> list[dict[str, Any]]:
    return [op for method, op in item.items() if method in _METHODS]


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


# -- the management port: FastAPI's generated document, with the statuses FastAPI cannot see --

# (method, path) -> the statuses the route's code answers besides the generic ones.
MANAGEMENT_STATUSES: dict[tuple[str, str], tuple[int, ...]] = {
    ("get", "/models"): (200, 400, 401),
    ("post", "/models"): (200, 202, 400, 401, 403, 404, 405, 409, 413, 500, 503, 504),
    ("get", "/models/{name}"): (200, 401, 404),
    ("put", "/models/{name}"): (200, 202, 206, 400, 401, 404),
    ("delete", "/models/{name}"): (200, 400, 401, 403, 404, 405, 503, 504),
    ("get", "/models/{name}/{version}"): (200, 401, 404),
    ("put", "/models/{name}/{version}"): (200, 202, 206, 400, 401, 404),
    ("delete", "/models/{name}/{version}"): (200, 400, 401, 403, 404, 405, 503, 504),
    ("put", "/models/{name}/{version}/set-default"): (200, 401, 404),
    ("get", "/v1/models/{name}"): (200, 401, 404),
    ("get", "/token"): (200, 400, 401, 404),
    ("options", "/"): (200,),
    ("get", "/openapi.json"): (200,),
}
_UNAUTHENTICATED = {("options", "/"), ("get", "/openapi.json")}  # /token: the API key


def management_document(document: dict[str, Any]) -> dict[str, Any]:
    """FastAPI's document for the management app, with every status each route can answer.

    FastAPI lists 200 and a 422 the app never sends (bad parameters answer 400, TorchServe's
    way); this replaces the 422 with the real error responses, described by the Error schema.
    """
    document.setdefault("paths", {}).setdefault("/openapi.json", {}).setdefault(
        "get", {"summary": "This API description", "responses": {}}
    )
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method not in _METHODS:
                continue
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            codes = MANAGEMENT_STATUSES.get((method, path), ())
            for code in (*codes, *MANAGEMENT_GENERIC):
                if str(code) not in responses:
                    responses.update(_errors(code) if code >= 400 else _status_response(code))
            if (method, path) not in _UNAUTHENTICATED:
                operation.setdefault("security", _BEARER)
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
    ``OPTIONS /`` and ``GET|OPTIONS /openapi.json`` answering ``document``.

    Anything else answers a JSON 404 or 405; a query string or Accept header that is not UTF-8
    (which prometheus_client would fail on with a 500) answers 400.
    """

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await _lifespan(receive, send)
            return
        path, method = scope["path"], scope["method"]
        try:
            if path == "/metrics":
                if method not in ("GET", "HEAD"):
                    raise MethodNotAllowed(f"{method} is not allowed on /metrics")
                _check_utf8(scope)
                await app(scope, receive, send)
            elif (path == "/" and method == "OPTIONS") or (
                path == "/openapi.json" and method in ("GET", "OPTIONS")
            ):
                await send_json(send, 200, document)
            elif path in ("/", "/openapi.json"):
                raise MethodNotAllowed(f"{method} is not allowed on {path}")
            else:
                raise NotFound("Requested resource is not found, please refer to API document.")
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


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
