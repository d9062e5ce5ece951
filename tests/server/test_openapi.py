"""The three ports' OpenAPI documents list every route each app answers, with every status.

Routes come from the apps themselves: FastAPI's route table for management, and for the raw
inference and metrics apps a request to each documented operation (routed: not a route-404)
plus every other method on each documented path (404/405 only).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, make_asgi_app
from starlette.routing import Route

from torchbay.server.http.auth import TokenAuth
from torchbay.server.http.inference import InferenceApp
from torchbay.server.http.management import MANAGEMENT_STATUSES, build_management_app
from torchbay.server.http.openapi import (
    INFERENCE_GENERIC,
    MANAGEMENT_GENERIC,
    METRICS_GENERIC,
    STATUS_TEXT,
    inference_openapi,
    metrics_openapi,
    with_openapi,
)
from torchbay.server.plane import DataPlane
from torchbay.server.serving.registry import ModelRegistry

from .conftest import make_config

METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")
ROUTE_404 = ("Requested resource is not found", "No route for")


def _registry(tmp_path: Path) -> tuple[ModelRegistry, Any]:
    config = make_config(tmp_path, enable_model_api=True)

    def place(*args: Any) -> Any:
        raise AssertionError("no model is loaded in these tests")

    return ModelRegistry(config, place=place, server_version="t", workdir=tmp_path / "w"), config


def _call(app: Any, method: str, path: str, **kw: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.request(method, path, **kw)

    return asyncio.run(go())


def _routes(routes: list[Any]) -> list[Route]:
    """FastAPI's routes, through included routers (``include_router`` without a prefix)."""
    out: list[Route] = []
    for route in routes:
        if isinstance(route, Route):
            out.append(route)
        else:
            out.extend(_routes(route.original_router.routes))
    return out


def _fill(template: str) -> str:
    return template.replace("{model_name}", "nosuch").replace("{model_version}", "9.9")


def _operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method.upper(), op)
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if method.upper() in METHODS
    ]


def test_every_documented_status_has_a_description():
    for doc in (inference_openapi("t"), metrics_openapi("t")):
        for _path, _method, op in _operations(doc):
            for code in op["responses"]:
                assert int(code) in STATUS_TEXT or code == "200"
        json.dumps(doc, allow_nan=False)  # a valid JSON document


def test_management_document_lists_every_route_with_its_statuses(tmp_path):
    registry, config = _registry(tmp_path)
    plane = DataPlane(registry, server_version="t", config=config)
    app = build_management_app(plane, config, auth=TokenAuth(tmp_path / "k.json", 60))
    doc = app.openapi()
    seen = set()
    for route in _routes(app.routes):
        for method in sorted((route.methods or set()) - {"HEAD"}):
            key = (method.lower(), route.path)
            seen.add(key)
            assert key in MANAGEMENT_STATUSES, f"{key} has no statuses declared on its route"
            responses = doc["paths"][route.path][method.lower()]["responses"]
            want = {str(c) for c in (*MANAGEMENT_STATUSES[key], *MANAGEMENT_GENERIC)}
            assert want <= set(responses), (key, want - set(responses))
            assert "422" not in responses  # FastAPI's default; the app answers 400
            for code, response in responses.items():
                if int(code) >= 400:
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/Error"}
    assert seen == set(MANAGEMENT_STATUSES)
    assert {(m, p) for p, m_, _ in _operations(doc) for m in [m_.lower()]} == seen
    assert doc["x-torchbay-generic-responses"] == [str(c) for c in MANAGEMENT_GENERIC]
    # Both descriptions of the port serve this document.
    assert _call(app, "GET", "/openapi.json").json() == doc
    assert _call(app, "OPTIONS", "/").json() == doc


def test_management_api_description_path(tmp_path):
    """TorchServe 0.12 serves its management API's description at ``GET /api-description`` too
    (ApiDescriptionRequestHandler, probed: 200 on port 8081), as the inference port does;
    torchbay's management port answered 404 there. Without a key, as ``OPTIONS /``."""
    registry, config = _registry(tmp_path)
    plane = DataPlane(registry, server_version="t", config=config)
    app = build_management_app(plane, config, auth=TokenAuth(tmp_path / "k.json", 60))
    for method in ("GET", "OPTIONS"):
        answer = _call(app, method, "/api-description")
        assert answer.status_code == 200, (method, answer.text)
        assert answer.json() == app.openapi()


def test_management_statuses_seen_are_documented(tmp_path):
    registry, config = _registry(tmp_path)
    plane = DataPlane(registry, server_version="t", config=config)
    app = build_management_app(plane, config, auth=TokenAuth(tmp_path / "k.json", 60))
    doc = app.openapi()
    cases = [
        ("GET", "/models", "/models", {}),  # 401: no key
        ("PUT", "/models/{name}", "/models/x?min_worker=abc", {}),
        ("GET", "/token", "/token?type=API", {}),
    ]
    for method, template, url, headers in cases:
        r = _call(app, method, url, headers=headers)
        assert str(r.status_code) in doc["paths"][template][method.lower()]["responses"]
        assert set(r.json()) == {"code", "type", "message"}


def test_inference_document_lists_every_route_the_app_answers(tmp_path):
    registry, _ = _registry(tmp_path)
    doc = inference_openapi("t")
    app = InferenceApp(
        DataPlane(registry, server_version="t"), max_request_size=1 << 20, openapi=doc
    )
    for path, method, op in _operations(doc):
        r = _call(app, method, _fill(path), content=b"{}")
        assert str(r.status_code) in op["responses"], (method, path, r.status_code)
        if r.status_code == 404:
            body = r.json()
            message = body.get("message") or body.get("error")
            assert not message.startswith(ROUTE_404), (method, path, message)
        if path.startswith("/v2") and r.status_code >= 400 and "ready" not in r.json():
            assert "error" in r.json()
        assert set(op["responses"]) >= {str(c) for c in INFERENCE_GENERIC}
    for path, item in doc["paths"].items():
        for method in METHODS:
            if method.lower() in item or method == "HEAD":
                continue
            r = _call(app, method, _fill(path), content=b"{}")
            if item.get("x-torchbay-any-method"):  # TorchServe's route: it checks no method
                message = r.json().get("message", "") if r.status_code == 404 else ""
                assert r.status_code != 405 and not message.startswith(ROUTE_404), (method, path)
            else:
                assert r.status_code in (404, 405), (method, path, r.status_code)
    assert _call(app, "OPTIONS", "/").json() == doc


def test_metrics_document_and_wrapper(tmp_path):
    doc = metrics_openapi("t")
    app = with_openapi(make_asgi_app(CollectorRegistry()), doc)
    for path, method, op in _operations(doc):
        r = _call(app, method, path)
        assert r.status_code == 200, (method, path)
        assert set(op["responses"]) >= {str(c) for c in METRICS_GENERIC}
    assert _call(app, "GET", "/openapi.json").json() == doc
    assert _call(app, "GET", "/metrics?name[]=x").status_code == 200
    # Any method and a trailing slash, as TorchServe 0.12 (tests/data/torchserve/methods).
    for method, path in (("POST", "/metrics"), ("GET", "/metrics/"), ("HEAD", "/metrics/")):
        assert _call(app, method, path).status_code == 200, (method, path)
    for method, path, status in [
        ("DELETE", "/openapi.json", 405),
        ("GET", "/", 405),
        ("GET", "/nothing", 404),
        ("GET", "/metrics/x", 404),
    ]:
        r = _call(app, method, path)
        assert r.status_code == status, (method, path)
        assert set(r.json()) == {"code", "type", "message"}


def _asgi(app: Any, query: bytes, headers: list[tuple[bytes, bytes]]) -> tuple[int, Any]:
    """One raw ASGI GET /metrics (httpx refuses to build these non-UTF-8 requests)."""
    sent: list[dict[str, Any]] = []
    scope = {"type": "http", "method": "GET", "path": "/metrics", "query_string": query}
    scope["headers"] = headers

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], json.loads(b"".join(m.get("body", b"") for m in sent[1:]))


@pytest.mark.parametrize(
    ("query", "headers"),
    [(b"name[]=\xff", []), (b"", [(b"accept", b"text/\xff")])],
)
def test_metrics_non_utf8_query_or_accept_is_400_not_a_crash(query, headers):
    # prometheus_client decodes these as UTF-8: it raised (a 500 from uvicorn) before.
    app = with_openapi(make_asgi_app(CollectorRegistry()), metrics_openapi("t"))
    status, body = _asgi(app, query, headers)
    assert status == 400
    assert body["code"] == 400
