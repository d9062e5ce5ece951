"""The management listener's model routes (list, describe, register, scale and tune, set the
default version, unregister), each with the statuses it answers declared next to it, and the
state and dependencies every management route shares.

Model settings (batch size, delay, timeouts, workers) are checked against ``ModelConfig``'s own
bounds before anything changes: an out-of-range, NaN or infinite value is a 400 naming the
parameter and the bound. Register and unregister answer 405 unless ``enable_model_api``.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from torchbay.server.config.settings import MAX_TIMEOUT_S, ServerConfig
from torchbay.server.config.sources import api_bool, api_int, api_number
from torchbay.server.errors import (
    BadRequest,
    ConfigError,
    MethodNotAllowed,
    NotFound,
    TorchbayError,
)
from torchbay.server.http.auth import TokenAuth
from torchbay.server.http.describe import describe
from torchbay.server.http.openapi import documented
from torchbay.server.http.params import (
    TORCHBAY_TUNING,
    RegisterParams,
    ScaleParams,
    check_model_settings,
    register_params,
    strict_number,
)
from torchbay.server.serving.model import ModelStatus, ModelVersion
from torchbay.server.serving.registry import ModelRegistry

log = logging.getLogger("torchbay.management")

_background: set[asyncio.Task] = set()


@dataclass
class Management:
    """What the management routes work on (``app.state.management``)."""

    registry: ModelRegistry
    config: ServerConfig
    auth: TokenAuth | None  # None: token authorization is off
    locks: weakref.WeakKeyDictionary[ModelVersion, asyncio.Lock] = field(
        default_factory=weakref.WeakKeyDictionary
    )

    def lock_for(self, mv: ModelVersion) -> asyncio.Lock:
        lock = self.locks.get(mv)
        if lock is None:
            lock = self.locks[mv] = asyncio.Lock()
        return lock


def management(request: Request) -> Management:
    return request.app.state.management


State = Annotated[Management, Depends(management)]


def management_key(request: Request, state: State) -> None:
    if state.auth is not None:
        state.auth.check(request.headers.get("authorization"), "management")


def model_api(state: State) -> None:
    if not state.config.enable_model_api:
        raise MethodNotAllowed(
            "Model API control is disabled: registering and unregistering models needs "
            "--enable-model-api (enable_model_api=true)"
        )


def status(message: str, code: int = 200) -> JSONResponse:
    return JSONResponse({"status": message}, status_code=code)


# -- list, describe -----------------------------------------------------------------------------

models = APIRouter(dependencies=[Depends(management_key)])
_CONTROL = [Depends(model_api)]


@models.get("/models", **documented(400, 401))
async def list_models(
    state: State, limit: str | None = None, next_page_token: str | None = None
) -> dict[str, Any]:
    """TorchServe's paging: a limit that is junk, negative or over 100 is 100; a junk or
    negative token is 0; ``nextPageToken`` is there unless the page ran past the end."""
    size = api_int(limit)
    size = 100 if size is None or not 0 <= size <= 100 else size
    token = api_int(next_page_token)
    token = 0 if token is None or token < 0 else token
    names = sorted(state.registry.models)
    body: dict[str, Any] = {}
    if token + size <= len(names):
        body["nextPageToken"] = str(token + size)
    page = names[token : token + size]
    body["models"] = [{"modelName": n, "modelUrl": state.registry.resolve(n).url} for n in page]
    return body


@models.get("/models/{name}", **documented(401, 404))
async def describe_default(state: State, name: str) -> list[dict[str, Any]]:
    return [describe(state.registry, state.registry.resolve(name))]


@models.get("/models/{name}/{version}", **documented(401, 404))
async def describe_version(state: State, name: str, version: str) -> list[dict[str, Any]]:
    registry = state.registry
    if version == "all":
        registry.resolve(name)
        return [describe(registry, mv) for mv in registry.models[name].values()]
    return [describe(registry, registry.resolve(name, version))]


# -- register -----------------------------------------------------------------------------------


async def _register_params(request: Request) -> RegisterParams:
    """The query string, overlaid by a JSON object body (TorchServe takes either)."""
    raw: dict[str, Any] = dict(request.query_params.items())
    if request.headers.get("content-type", "").startswith("application/json"):
        body = await request.body()
        if body.strip():
            try:
                data = await request.json()
            except (ValueError, RecursionError):  # RecursionError: nested too deep
                raise BadRequest("The request body is not valid JSON") from None
            if not isinstance(data, dict):
                raise BadRequest("The JSON body must be an object of register parameters")
            raw.update(data)
    return register_params(raw)


@models.post(
    "/models", dependencies=_CONTROL, **documented(202, 400, 401, 403, 404, 405, 409, 413,
                                                   500, 503, 504)
)  # fmt: skip
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
    return await register(state, await _register_params(request))


async def register(state: Management, params: RegisterParams) -> JSONResponse:
    """Register an archive (``POST /models``; gRPC ``RegisterModel``)."""
    check_model_settings(params.model_dump())
    config = state.config
    # TorchServe registers with default_workers_per_model only when the server sets it, else 0.
    set_default = "default_workers_per_model" in config.model_fields_set
    default_workers = config.default_workers_per_model if set_default else 0
    overrides: dict[str, Any] = {
        key: value
        for key in (
            "batch_size",
            "max_batch_delay",
            "response_timeout",
            "startup_timeout",
            *TORCHBAY_TUNING,
        )
        if (value := getattr(params, key)) is not None
    }
    if params.handler is not None:
        overrides["handler"] = params.handler
    try:
        mv = await state.registry.register(
            params.url,
            name=params.model_name,
            overrides=overrides,
            initial_workers=params.initial_workers,
            synchronous=params.synchronous,
            default_workers=default_workers,
            startup=False,
        )
    except ConfigError as exc:  # a bad setting from the request, mapped at the boundary
        raise BadRequest(exc.message) from None
    registered = f'Model "{mv.name}" Version: {mv.version} registered with'
    if mv.settings.min_workers == 0:
        return status(
            f"{registered} 0 initial workers. Use scale workers API to add workers for the model."
        )
    if not params.synchronous:
        return status("Processing worker updates...", 202)
    return status(f"{registered} {mv.ready_workers} initial workers")


# -- scale and tune -----------------------------------------------------------------------------


async def _settle(mv: ModelVersion) -> None:
    """Wait (bounded by the start-up timeout) while workers of ``mv`` are still starting, e.g.
    those of an asynchronous registration: a scale counts them once they have loaded."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + mv.settings.startup_timeout_s + 5
    while mv.status is ModelStatus.LOADING and loop.time() < deadline:
        await asyncio.sleep(0.05)


async def _scale(state: Management, mv: ModelVersion, params: ScaleParams) -> None:
    async with state.lock_for(mv):
        await _settle(mv)
        if (
            params.batch_size is not None
            or params.max_batch_delay is not None
            or params.response_timeout is not None
            or params.max_queue_delay_ms is not None
            or params.sla_p99_ms is not None
        ):
            mv.configure(
                batch_size=params.batch_size,
                max_batch_delay_ms=params.max_batch_delay,
                response_timeout_s=params.response_timeout,
                max_queue_delay_ms=params.max_queue_delay_ms,
                sla_p99_ms=params.sla_p99_ms,
            )
        if params.min_worker is not None:
            await mv.scale(params.min_worker, params.max_worker)


def _scale_params(
    min_worker: int | None,
    max_worker: int | None,
    synchronous: bool,
    timeout: float,
    tuning: dict[str, Any],
) -> ScaleParams:
    """TorchServe's defaults filled in and every value checked, or BadRequest."""
    if not -1 <= timeout <= MAX_TIMEOUT_S:
        raise BadRequest(f"timeout must be -1 to {MAX_TIMEOUT_S:g} seconds, got {timeout}")
    if min_worker is None and all(v is None for v in tuning.values()):
        min_worker = 1  # TorchServe's default
    if min_worker is not None and max_worker is None:
        max_worker = max(min_worker, 0)
    if min_worker is None and max_worker is not None:
        raise BadRequest("max_worker needs min_worker")
    if max_worker is not None and min_worker is not None and max_worker < min_worker:
        raise BadRequest("max_worker cannot be less than min_worker.")  # TorchServe's words
    check_model_settings({"min_worker": min_worker, "max_worker": max_worker, **tuning})
    return ScaleParams(
        min_worker=min_worker,
        max_worker=max_worker,
        synchronous=synchronous,
        timeout=timeout,
        **tuning,
    )


@models.put("/models/{name}", **documented(202, 206, 400, 401, 404))
@models.put("/models/{name}/{version}", **documented(202, 206, 400, 401, 404))
async def scale_model(
    state: State,
    name: str,
    version: str | None = None,
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
    mv = state.registry.resolve(name, version)
    # TorchServe's own parameters parse leniently (junk is the default); torchbay's live tuning
    # (not in TorchServe's scale API) is refused when it is not a number (nothing changes).
    tuning = {
        "batch_size": strict_number("batch_size", batch_size, api_int),
        "max_batch_delay": strict_number("max_batch_delay", max_batch_delay, api_number),
        "response_timeout": strict_number("response_timeout", response_timeout, api_number),
        "max_queue_delay_ms": strict_number("max_queue_delay_ms", max_queue_delay_ms, api_number),
        "sla_p99_ms": strict_number("sla_p99_ms", sla_p99_ms, api_number),
    }
    drain = api_number(timeout)  # TorchServe's parameter: junk is its default, -1
    params = _scale_params(
        api_int(min_worker),
        api_int(max_worker),
        api_bool(synchronous, False),
        -1 if drain is None else drain,
        tuning,
    )
    if not params.synchronous:
        task = asyncio.ensure_future(_scale(state, mv, params))
        _background.add(task)
        task.add_done_callback(_scale_done)
        return status("Processing worker updates...", 202)
    await _scale(state, mv, params)
    if params.min_worker is None:
        return status(f"Model {mv.name} version {mv.version} updated")
    # TorchServe 0.12 (ApiUtils.updateModelWorkers): 200 when scaled, 500 when starting the
    # workers failed, 206 when they are not all up yet.
    if mv.ready_workers < params.min_worker:
        if mv.load_error is not None:
            log.warning("model %s: scaling failed: %s", mv.key, mv.load_error)
            failed = f"Failed to start workers for model {mv.name} version: {mv.version}"
            raise TorchbayError(failed)
        return status("Workers scaling in progress...", 206)
    scaled = f"Workers scaled to {params.min_worker} for model: {mv.name}"
    return status(scaled if version is None else f"{scaled}, version: {version}")


def _scale_done(task: asyncio.Task) -> None:
    _background.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("scaling failed", exc_info=task.exception())


# -- default version, unregister ----------------------------------------------------------------


@models.put("/models/{name}/{version}/set-default", **documented(401, 404))
async def set_default(state: State, name: str, version: str) -> JSONResponse:
    state.registry.set_default(name, version)
    return status(f'Default version successfully updated for model "{name}" to "{version}"')


async def _unregister(state: Management, name: str, version: str | None) -> JSONResponse:
    registry, timeout = state.registry, state.config.unregister_model_timeout_s
    versions = registry.models.get(name) or {}
    target = versions.get(version if version is not None else registry.defaults.get(name, ""))
    if target is None:
        # Unknown model (404) or version (400, as TorchServe): the registry says which.
        await registry.unregister(name, version, timeout)
        raise NotFound(f"Model not found: {name}")
    async with state.lock_for(target):
        await registry.unregister(name, target.version, timeout)
    return status(f'Model "{name}" unregistered')


_UNREGISTER = documented(400, 401, 403, 404, 405, 503, 504)


@models.delete("/models/{name}", dependencies=_CONTROL, **_UNREGISTER)
async def unregister_default(state: State, name: str) -> JSONResponse:
    return await _unregister(state, name, None)


@models.delete("/models/{name}/{version}", dependencies=_CONTROL, **_UNREGISTER)
async def unregister_version(state: State, name: str, version: str) -> JSONResponse:
    return await _unregister(state, name, version)
