"""OpenAPI 3.0 descriptions of the inference and metrics ports (the management port's comes from
FastAPI). Served by ``OPTIONS /`` and ``GET /openapi.json`` on each port, as TorchServe's
``OPTIONS /`` API description does. Also a tiny ASGI wrapper that adds those two routes to an app
that lacks them (the Prometheus metrics app). Torch-free.
"""

from __future__ import annotations

from typing import Any

from torchbay.server.http import ASGIApp, Receive, Scope, Send, send_json
from torchbay.server.kserve_v1 import openapi_path

_ERROR = {
    "type": "object",
    "properties": {
        "code": {"type": "integer"},
        "type": {"type": "string"},
        "message": {"type": "string"},
    },
}
_BEARER = [{"bearer": []}]


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {
        400: "Bad input",
        401: "Missing, wrong or expired inference key",
        404: "Unknown model or version",
        413: "Request too large",
        500: "Handler error",
        503: "Queue full, no worker, or shutting down",
        504: "Timed out",
    }
    return {str(c): _json({"$ref": "#/components/schemas/Error"}, text[c]) for c in codes}


def _path_params(*names: str) -> list[dict[str, Any]]:
    return [
        {"name": n, "in": "path", "required": True, "schema": {"type": "string"}} for n in names
    ]


def _predict(version: bool, explain: bool = False) -> dict[str, Any]:
    verb = "Explain" if explain else "Predict"
    return {
        "summary": f"{verb} with the {'given' if version else 'default'} version of a model",
        "security": _BEARER,
        "parameters": _path_params("model_name", *(["model_version"] if version else [])),
        "requestBody": {
            "description": "Raw bytes, JSON or multipart form data; passed to the handler as is",
            "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
        },
        "responses": {
            "200": {"description": "The handler's output", "content": {"*/*": {}}},
            **_errors(400, 401, 404, 413, 500, 503, 504),
        },
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
                    **_errors(400, 401, 404, 503, 504),
                },
            }
        }
    if action == "ready":
        ready = {
            "type": "object",
            "properties": {"name": {"type": "string"}, "ready": {"type": "boolean"}},
        }
        return {
            "get": {
                "summary": "Model readiness",
                "security": _BEARER,
                "parameters": params,
                "responses": {"200": _json(ready, "Ready"), "503": _json(ready, "Not ready")},
            }
        }
    return {
        "get": {
            "summary": "Model metadata",
            "security": _BEARER,
            "parameters": params,
            "responses": {"200": _json({"type": "object"}), **_errors(401, 404)},
        }
    }


def _describe() -> dict[str, Any]:
    return {
        "options": {
            "summary": "This API description",
            "responses": {"200": _json({"type": "object"})},
        }
    }


def inference_openapi(server_version: str) -> dict[str, Any]:
    """The inference port (TorchServe's inference API and the Open Inference Protocol)."""
    paths: dict[str, Any] = {
        "/": _describe(),
        "/openapi.json": {"get": _describe()["options"]},
        "/ping": {
            "get": {
                "summary": "Health: 200 when every default model version has its minimum workers",
                "responses": {
                    "200": _json({"type": "object", "properties": {"status": {"type": "string"}}}),
                    "500": {"description": "Unhealthy"},
                },
            }
        },
        "/predictions/{model_name}": {"post": _predict(False), "put": _predict(False)},
        "/predictions/{model_name}/{model_version}": {
            "post": _predict(True),
            "put": _predict(True),
        },
        "/explanations/{model_name}": {"post": _predict(False, explain=True)},
        "/explanations/{model_name}/{model_version}": {"post": _predict(True, explain=True)},
        "/v2": {
            "get": {"summary": "Server metadata", "responses": {"200": _json({"type": "object"})}}
        },
        "/v2/health/live": {
            "get": {"summary": "Liveness", "responses": {"200": _json({"type": "object"})}}
        },
        "/v2/health/ready": {
            "get": {
                "summary": "Readiness: every model version has a ready worker",
                "responses": {"200": {"description": "Ready"}, "503": {"description": "Not"}},
            }
        },
    }
    for version in (False, True):
        base = "/v2/models/{model_name}" + ("/versions/{model_version}" if version else "")
        paths[base] = _v2_model("", version)
        paths[base + "/ready"] = _v2_model("ready", version)
        paths[base + "/infer"] = _v2_model("infer", version)
    paths["/v1/models/{model_name}:predict"] = openapi_path()
    return _document("torchbay inference API", server_version, paths)


def metrics_openapi(server_version: str) -> dict[str, Any]:
    """The metrics port: Prometheus text on ``/metrics`` (no key needed)."""
    paths = {
        "/": _describe(),
        "/openapi.json": {"get": _describe()["options"]},
        "/metrics": {
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
        },
    }
    return _document("torchbay metrics API", server_version, paths)


def _document(title: str, version: str, paths: dict[str, Any]) -> dict[str, Any]:
    return {
        "openapi": "3.0.1",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {
            "schemas": {"Error": _ERROR},
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A key from the server's key file (key_file.json)",
                }
            },
        },
    }


def with_openapi(app: ASGIApp, document: dict[str, Any]) -> ASGIApp:
    """``app`` plus ``OPTIONS /`` and ``GET /openapi.json`` answering ``document``."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (
            (scope["path"] == "/" and scope["method"] == "OPTIONS")
            or (scope["path"] == "/openapi.json" and scope["method"] in ("GET", "OPTIONS"))
        ):
            await send_json(send, 200, document)
            return
        await app(scope, receive, send)

    return wrapped
