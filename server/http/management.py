"""The management listener (default 8081), TorchServe-compatible.

    GET    /models?limit=&next_page_token=            list (a page of) model names
    POST   /models?url=&model_name=&...               register (or a JSON body); model API only
    GET    /models/{m}[/{v}|/all]                     describe: a JSON array
    PUT    /models/{m}[/{v}]?min_worker=&max_worker=  scale (and batch_size, max_batch_delay,
                                                      response_timeout live)
    PUT    /models/{m}/{v}/set-default                choose the version /predictions/{m} uses
    DELETE /models/{m}[/{v}]                          drain and unregister; model API only
    GET    /v1/models/{m}                             KServe v1 readiness {"name", "ready"}
    GET    /token?type=management|inference          rotate a key (needs the API key)
    OPTIONS /   GET /openapi.json                     this API's OpenAPI description (also
    GET|OPTIONS /api-description                      TorchServe's path for it)

The model routes are ``model_routes.models``; the others are here. Each route declares the
statuses it answers (``openapi.documented``), which is what its OpenAPI entry lists. With token
auth on, every route but the API description needs ``Authorization: Bearer`` with the
management key (``/token``: the API key). Errors are ``{"code", "type", "message"}``; bad
parameter values are 400.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from torchbay.server.config.settings import ServerConfig
from torchbay.server.errors import (
    BadRequest,
    ClientDisconnected,
    MethodNotAllowed,
    NotFound,
    TorchbayError,
)
from torchbay.server.http.auth import TokenAuth
from torchbay.server.http.model_routes import Auth, State, management_key, models
from torchbay.server.http.openapi import document_management, documented
from torchbay.server.http.workflow_routes import workflows as workflow_router
from torchbay.server.plane import DataPlane, ModelStatus
from torchbay.server.plane.params import validation_message
from torchbay.server.workflows.manager import Workflows

log = logging.getLogger("torchbay.management")

# -- KServe v1 readiness, keys, the API description --------------------------------------------

kserve = APIRouter(dependencies=[Depends(management_key)])
keys = APIRouter()  # /token checks the API key itself
description = APIRouter()


@kserve.get("/v1/models/{name}", **documented(401, 404))
async def kserve_ready(state: State, name: str) -> dict[str, Any]:
    mv = state.registry.resolve(name)
    return {"name": name, "ready": mv.status is ModelStatus.READY}


@keys.get("/token", **documented(400, 401, 404, 503))
async def rotate_token(request: Request, auth: Auth, type: str = "management") -> dict[str, Any]:
    if auth is None:
        raise NotFound("Token authorization is disabled on this server")
    auth.check(request.headers.get("authorization"), "API")
    return auth.rotate(type)


@description.options("/", **documented(auth=False))
@description.get("/api-description", **documented(auth=False))
@description.options("/api-description", **documented(auth=False))
async def api_description(request: Request) -> dict[str, Any]:
    """This API's description (TorchServe's ``OPTIONS /`` and ``/api-description``)."""
    return request.app.openapi()


ROUTERS = (models, kserve, keys, description)
_ROUTES = tuple(  # every route, for a 405's Allow (the app wraps the routers it includes)
    r for router in (*ROUTERS, workflow_router) for r in router.routes if isinstance(r, APIRoute)
)

# (method, path) -> the statuses the route answers besides the port's generic ones, as each
# route declares them; FastAPI's own GET /openapi.json answers 200.
MANAGEMENT_STATUSES: dict[tuple[str, str], tuple[int, ...]] = {
    (method.lower(), route.path): (200, *(int(code) for code in route.responses))
    for router in ROUTERS
    for route in router.routes
    if isinstance(route, APIRoute)
    for method in sorted(route.methods)
}
MANAGEMENT_STATUSES[("get", "/openapi.json")] = (200,)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(TorchbayError)
    async def _torchbay_error(request: Request, exc: TorchbayError) -> JSONResponse:
        return JSONResponse(exc.to_json(), status_code=exc.status, headers=exc.headers or None)

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(BadRequest(validation_message(exc)).to_json(), status_code=400)

    @app.exception_handler(ValidationError)
    async def _invalid(request: Request, exc: ValidationError) -> JSONResponse:
        return JSONResponse(BadRequest(validation_message(exc)).to_json(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        error: TorchbayError
        if exc.status_code == 404:
            error = NotFound("Requested resource is not found, please refer to API document.")
        elif exc.status_code == 405:
            error = MethodNotAllowed(
                "Requested method is not allowed, please refer to API document.",
                headers={"Allow": _allowed(request)},
            )
        else:
            error = TorchbayError(str(exc.detail))
            error.status = exc.status_code
        return JSONResponse(
            error.to_json(), status_code=error.status, headers=error.headers or exc.headers
        )

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, exc: ClientDisconnect) -> JSONResponse:
        # The client left (or was timed out) mid-body: nobody reads this answer.
        log.info("management request %s %s: client disconnected", request.method, request.url.path)
        error = ClientDisconnected("client disconnected")
        return JSONResponse(error.to_json(), status_code=error.status)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.error("management request %s %s failed", request.method, request.url.path, exc_info=exc)
        return JSONResponse(TorchbayError("Internal server error").to_json(), status_code=500)


def _allowed(request: Request) -> str:
    """Every method a route of this path takes (Starlette's 405 names only the first route's:
    ``DELETE /models`` said ``Allow: GET``, though ``POST /models`` registers)."""
    path = request.scope["path"]
    methods = {m for route in _ROUTES if route.path_regex.match(path) for m in route.methods}
    return ", ".join(sorted(methods))


class _OneTrailingSlash:
    """``/models/m/`` routes as ``/models/m``: one trailing slash dropped before routing."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and len(path) > 1 and path.endswith("/"):
            scope = {**scope, "path": path[:-1]}
            raw = scope.get("raw_path")
            if raw and raw.endswith(b"/"):
                scope["raw_path"] = raw[:-1]
        await self.app(scope, receive, send)


def build_management_app(
    plane: DataPlane,
    config: ServerConfig,
    *,
    auth: TokenAuth | None = None,
    workflows: Workflows | None = None,
) -> FastAPI:
    """The management API over the data plane; ``auth`` None means token auth is off."""
    # No trailing-slash redirects (a redirected DELETE or PUT is a second request the client
    # did not send); one trailing slash is the same path, as TorchServe reads its paths
    # (`DELETE /models/m/` unregisters m: its Postman collection does that).
    app = FastAPI(
        title="torchbay management", docs_url=None, redoc_url=None, redirect_slashes=False
    )
    app.add_middleware(_OneTrailingSlash)
    app.state.management = plane.management
    app.state.auth = auth
    _install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    if workflows is not None:  # TorchServe's workflow management (http/workflow_routes.py)
        app.state.workflows = workflows
        app.include_router(workflow_router)
    document_management(app)  # the generic statuses, the schemas, no FastAPI 422
    return app
