"""The management listener's model routes (list, describe, register, scale and tune, set the
default version, unregister), each with the statuses it answers declared next to it: thin
adapters over the plane's management operations (``plane.management``), which answer plain data
and raise ``errors``' tree (mapped by the app's error handlers). The query parameters each route
declares are its API description; the values are parsed by ``plane.params``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from torchbay.server.config.sources import api_bool, api_int
from torchbay.server.errors import BadRequest
from torchbay.server.http.asgi import read_body
from torchbay.server.http.auth import TokenAuth
from torchbay.server.http.openapi import documented, model_document
from torchbay.server.plane import management as plane
from torchbay.server.plane.management import Management, Status
from torchbay.server.plane.params import check_json_numbers, register_params


def management(request: Request) -> Management:
    return request.app.state.management


def token_auth(request: Request) -> TokenAuth | None:
    """The management app's token authorization (None: off)."""
    return request.app.state.auth


State = Annotated[Management, Depends(management)]
Auth = Annotated[TokenAuth | None, Depends(token_auth)]


def management_key(request: Request, auth: Auth) -> None:
    if auth is not None:
        auth.check(request.headers.get("authorization"), "management")


def model_api(state: State) -> None:
    plane.require_model_api(state)


def status(answer: Status) -> JSONResponse:
    return JSONResponse(answer.body, status_code=answer.code)


def first_values(request: Request) -> dict[str, str]:
    """The query string, each parameter's first value: TorchServe's (Netty's decoder, then
    ``NettyUtils.getParameter``) for ``?min_worker=1&min_worker=2``, where starlette keeps the
    last."""
    query = request.query_params
    return {key: query.getlist(key)[0] for key in query}


# -- list, describe -----------------------------------------------------------------------------

models = APIRouter(dependencies=[Depends(management_key)])
_CONTROL = [Depends(model_api)]


@models.get("/models", **documented(400, 401))
async def list_models(
    request: Request, state: State, limit: str | None = None, next_page_token: str | None = None
) -> dict[str, Any]:
    """TorchServe's paging: a limit that is junk, negative or over 100 is 100; a junk or
    negative token is 0; ``nextPageToken`` is there unless the page ran past the end. The
    parameters declared are the API description; each one's first value is the one read."""
    query = first_values(request)
    return plane.list_models(
        state, api_int(query.get("limit")), api_int(query.get("next_page_token"))
    )


@models.get("/models/{name}", **documented(401, 404, 500, 503))
async def describe_default(
    request: Request, state: State, name: str, customized: str | None = None
) -> list[dict[str, Any]]:
    """``customized=true``: with the handler's ``customizedMetadata`` (a worker answers it)."""
    wanted = api_bool(first_values(request).get("customized"), False)
    return await plane.describe(state, name, None, wanted)


@models.get("/models/{name}/{version}", **documented(401, 404, 500, 503))
async def describe_version(
    request: Request, state: State, name: str, version: str, customized: str | None = None
) -> list[dict[str, Any]]:
    wanted = api_bool(first_values(request).get("customized"), False)
    return await plane.describe(state, name, version, wanted)


@models.options("/models/{name}", **documented(401, 404))
@models.options("/models/{name}/{version}", **documented(401, 404))
async def model_api(
    request: Request, state: State, name: str, version: str | None = None
) -> dict[str, Any]:
    """TorchServe's ``OPTIONS /models/{m}[/{v}]``: this API's operations on one model the server
    has (404 for a model or version it lacks)."""
    mv = plane.present(state, name, version)
    title = "RESTful Management API for"
    return model_document(request.app.openapi(), mv.name, "{name}", title)


# -- register -----------------------------------------------------------------------------------


async def _register_params(request: Request, limit: int) -> Any:
    """The query string, overlaid by a JSON object body (TorchServe takes either) of at most
    ``limit`` bytes (``max_request_size``, as TorchServe bounds every listener's request)."""
    raw: dict[str, Any] = first_values(request)
    if request.headers.get("content-type", "").startswith("application/json"):
        body = await read_body(request.scope, request.receive, limit)
        if body.strip():
            try:
                data = json.loads(body)
            except (ValueError, RecursionError):  # RecursionError: nested too deep
                raise BadRequest("The request body is not valid JSON") from None
            if not isinstance(data, dict):
                raise BadRequest("The JSON body must be an object of register parameters")
            check_json_numbers(data)
            raw.update(data)
    return register_params(raw)


_REGISTER = documented(202, 400, 401, 403, 404, 405, 409, 413, 500, 503, 504, 507)


@models.post("/models", dependencies=_CONTROL, **_REGISTER)
async def register_model(
    request: Request,
    state: State,
    url: str | None = None,
    model_name: str | None = None,
    handler: str | None = None,
    runtime: str | None = None,
    batch_size: str | None = None,  # the parameters, declared for the API description;
    max_batch_delay: str | None = None,  # parsed as TorchServe does by _register_params
    initial_workers: str | None = None,
    synchronous: str | None = None,
    response_timeout: str | None = None,
    startup_timeout: str | None = None,
    max_queue_delay_ms: str | None = None,  # torchbay's: the queue-time bound (0: off)
    sla_p99_ms: str | None = None,  # torchbay's: the autopilot's p99 target (0: off)
) -> JSONResponse:
    params = await _register_params(request, state.config.max_request_size)
    return status(await plane.register(state, params))


# -- scale and tune -----------------------------------------------------------------------------


@models.put("/models/{name}", **documented(202, 206, 400, 401, 404))
@models.put("/models/{name}/{version}", **documented(202, 206, 400, 401, 404))
async def scale_model(
    request: Request,
    state: State,
    name: str,
    version: str | None = None,
    model_version: str | None = None,  # TorchServe's: the version when the path names none
    min_worker: str | None = None,  # parsed as TorchServe does: junk is the default
    max_worker: str | None = None,
    synchronous: str | None = None,
    timeout: str | None = None,
    batch_size: str | None = None,
    max_batch_delay: str | None = None,
    response_timeout: str | None = None,
    max_queue_delay_ms: str | None = None,
    sla_p99_ms: str | None = None,
) -> JSONResponse:
    # The parameters above are the API description; the query string as it came is what
    # plane.params.scale_params parses (TorchServe's leniency, torchbay's strict live settings).
    query = first_values(request)
    if version is None:  # PUT /models/m?model_version=v scales v, as TorchServe's handler does
        version = query.get("model_version") or None
    return status(await plane.scale(state, name, version, query))


# -- default version, unregister ----------------------------------------------------------------


@models.put("/models/{name}/{version}/set-default", **documented(401, 404))
async def set_default(state: State, name: str, version: str) -> JSONResponse:
    return status(plane.set_default(state, name, version))


_UNREGISTER = documented(400, 401, 403, 404, 405, 503, 504)


@models.delete("/models/{name}", dependencies=_CONTROL, **_UNREGISTER)
async def unregister_default(state: State, name: str) -> JSONResponse:
    return status(await plane.unregister(state, name, None))


@models.delete("/models/{name}/{version}", dependencies=_CONTROL, **_UNREGISTER)
async def unregister_version(state: State, name: str, version: str) -> JSONResponse:
    return status(await plane.unregister(state, name, version))
