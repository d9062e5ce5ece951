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
    OPTIONS /   GET /openapi.json                     this API's OpenAPI description

With token auth on, every route but the API description needs ``Authorization: Bearer`` with
the management key (``/token``: the API key). Register and unregister answer 405 unless
``enable_model_api``. Errors are ``{"code", "type", "message"}``; bad parameter values are 400.
Model settings (batch size, delay, timeouts, workers) are checked against ``ModelConfig``'s own
bounds before anything changes: an out-of-range, NaN or infinite value is a 400 naming the
parameter and the bound.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import weakref
from typing import Any

import psutil
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from torchbay.server.config.settings import API_NAMES, MAX_TIMEOUT_S, ModelConfig, ServerConfig
from torchbay.server.errors import (
    BadRequest,
    ClientDisconnected,
    ConfigError,
    MethodNotAllowed,
    NotFound,
    TorchbayError,
)
from torchbay.server.http.auth import TokenAuth
from torchbay.server.http.openapi import document_management
from torchbay.server.serving.model import ModelStatus, ModelVersion
from torchbay.server.serving.registry import ModelRegistry

log = logging.getLogger("torchbay.management")

_background: set[asyncio.Task] = set()


class RegisterParams(BaseModel):
    """``POST /models`` parameters (TorchServe's names), from the query string or a JSON body."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    url: str = Field(min_length=1)
    model_name: str | None = Field(None, min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    handler: str | None = None
    runtime: str | None = None  # accepted; torchbay runs Python handlers only
    batch_size: int | None = Field(None, ge=1)
    max_batch_delay: float | None = Field(None, ge=0)
    initial_workers: int | None = Field(None, ge=0)
    synchronous: bool = True  # TorchServe's code default (its docs say false)
    response_timeout: float | None = Field(None, gt=0)
    startup_timeout: float | None = Field(None, gt=0)
    s3_sse_kms: bool | None = None  # accepted and ignored (no S3 here)


class ScaleParams(BaseModel):
    """``PUT /models/{m}[/{v}]`` parameters."""

    model_config = ConfigDict(frozen=True, allow_inf_nan=False)

    min_worker: int | None = Field(None, ge=0)
    max_worker: int | None = Field(None, ge=0)
    synchronous: bool = False
    timeout: float = -1  # TorchServe's drain timeout; torchbay always drains the batch in hand
    batch_size: int | None = Field(None, ge=1)
    max_batch_delay: float | None = Field(None, ge=0)
    response_timeout: float | None = Field(None, gt=0)


# API parameter -> ModelConfig field, for the bounds check (register's initial_workers too).
_BOUNDED = {
    **{k: v for k, v in API_NAMES.items() if k != "handler"},
    "initial_workers": "min_workers",
}


def check_model_settings(params: dict[str, Any]) -> None:
    """Raise BadRequest unless each given API parameter is within ``ModelConfig``'s bounds.

    ``params`` maps TorchServe parameter names to values (None = not given). ModelConfig is the
    one definition of the limits (config.properties, model-config.yaml and this API share it).
    """
    fields = {_BOUNDED[k]: v for k, v in params.items() if v is not None and k in _BOUNDED}
    if not fields:
        return
    try:
        ModelConfig.model_validate(fields)
    except ValidationError as exc:
        names = {_BOUNDED[k]: k for k, v in params.items() if v is not None and k in _BOUNDED}
        parts = []
        for err in exc.errors():
            loc = [names.get(str(p), str(p)) for p in err.get("loc", ())]
            parts.append(
                f"{'.'.join(loc) or 'request'}: {err.get('msg')} (got {err.get('input')!r})"
            )
        raise BadRequest("Invalid parameter(s): " + "; ".join(parts)) from None


def _rss(pid: int | None) -> int:
    if pid is None:
        return 0
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except (psutil.Error, OSError):
        return 0  # the worker just exited


def describe(registry: ModelRegistry, mv: ModelVersion) -> dict[str, Any]:
    """TorchServe's describe-model object, plus what torchbay knows beyond it."""
    s = mv.settings
    config = registry.model_configs.get(mv.key)
    info = getattr(mv.manifest, "torchbay", None)
    workers = []
    for slot in mv.slots:
        w = slot.worker
        pid = w.pid if w else None
        workers.append(
            {
                "id": str(w.id if w else slot.index),
                "startTime": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(w.start_time))
                if w
                else None,
                "status": slot.state.value,
                "memoryUsage": _rss(pid),
                "pid": pid,
                "gpu": slot.placement.gpu_id is not None,
                "gpuUsage": "N/A",
                "device": w.device if w else None,
                "threads": slot.placement.threads,
                "restarts": slot.restarts,
                "startFailures": slot.start_failures,
                "recycles": slot.recycles,
            }
        )
    return {
        "modelName": mv.name,
        "modelVersion": mv.version,
        "modelUrl": mv.url,
        "runtime": "python",
        "minWorkers": s.min_workers,
        "maxWorkers": s.max_workers,
        "batchSize": s.batch_size,
        "maxBatchDelay": s.max_batch_delay_ms,
        "responseTimeout": s.response_timeout_s,
        "startupTimeout": s.startup_timeout_s,
        "maxRetryTimeoutInSec": s.max_retry_timeout_s,
        "clientTimeoutInMills": s.client_timeout_ms,
        "deviceType": config.device_type if config else "auto",
        "deviceIds": config.device_ids if config else None,
        "status": mv.status.value,
        "loadError": mv.load_error,
        "workerRestarts": mv.restarts,
        "workerStartFailures": mv.start_failures,
        "workerRecycles": mv.recycles,
        "maxRequestsPerWorker": s.max_requests_per_worker,
        "maxWorkerRssMb": s.max_worker_rss_mb,
        "loadedAtStartup": True,
        "isDefault": registry.is_default(mv),
        "workers": workers,
        "metrics": {
            "rejectedRequests": mv.requests_rejected,
            "waitingQueueSize": len(mv.queue),
            "requests": mv.requests_received,
        },
        "jobQueueStatus": {
            "remainingCapacity": mv.queue.remaining_capacity,
            "pendingRequests": len(mv.queue),
        },
        "format": getattr(info, "format", None),
        "precision": getattr(info, "precision", None),
    }


def _status(message: str, code: int = 200) -> JSONResponse:
    return JSONResponse({"status": message}, status_code=code)


def _validation_message(exc: ValidationError | RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p not in ("query", "body", "path")]
        parts.append(f"{'.'.join(loc) or 'request'}: {err.get('msg')}")
    return "Invalid parameter(s): " + "; ".join(parts)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(TorchbayError)
    async def _torchbay_error(request: Request, exc: TorchbayError) -> JSONResponse:
        return JSONResponse(exc.to_json(), status_code=exc.status, headers=exc.headers or None)

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(BadRequest(_validation_message(exc)).to_json(), status_code=400)

    @app.exception_handler(ValidationError)
    async def _invalid(request: Request, exc: ValidationError) -> JSONResponse:
        return JSONResponse(BadRequest(_validation_message(exc)).to_json(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        error: TorchbayError
        if exc.status_code == 404:
            error = NotFound("Requested resource is not found, please refer to API document.")
        elif exc.status_code == 405:
            error = MethodNotAllowed(
                "Requested method is not allowed, please refer to API document."
            )
        else:
            error = TorchbayError(str(exc.detail))
            error.status = exc.status_code
        return JSONResponse(error.to_json(), status_code=error.status, headers=exc.headers)

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


def build_management_app(
    registry: ModelRegistry, config: ServerConfig, *, auth: TokenAuth | None = None
) -> FastAPI:
    """The management API over ``registry``; ``auth`` None means token auth is off."""
    # No trailing-slash redirects: a client following `DELETE /models/m/` -> 307 would unregister
    # a model it did not name exactly; an unknown path is a 404.
    app = FastAPI(
        title="torchbay management", docs_url=None, redoc_url=None, redirect_slashes=False
    )
    _install_error_handlers(app)
    locks: weakref.WeakKeyDictionary[ModelVersion, asyncio.Lock] = weakref.WeakKeyDictionary()

    def lock_for(mv: ModelVersion) -> asyncio.Lock:
        lock = locks.get(mv)
        if lock is None:
            lock = locks[mv] = asyncio.Lock()
        return lock

    def management_key(request: Request) -> None:
        if auth is not None:
            auth.check(request.headers.get("authorization"), "management")

    def model_api() -> None:
        if not config.enable_model_api:
            raise MethodNotAllowed(
                "Model API control is disabled: registering and unregistering models needs "
                "--enable-model-api (enable_model_api=true)"
            )

    api = APIRouter(dependencies=[Depends(management_key)])

    # -- list, describe -------------------------------------------------------------------------

    @api.get("/models")
    async def list_models(limit: int = 100, next_page_token: int = 0) -> dict[str, Any]:
        if next_page_token < 0:
            raise BadRequest("next_page_token must be >= 0")
        limit = max(0, min(limit, 100))
        names = sorted(registry.models)
        page = names[next_page_token : next_page_token + limit]
        body: dict[str, Any] = {
            "models": [{"modelName": n, "modelUrl": registry.resolve(n).url} for n in page]
        }
        if next_page_token + limit < len(names):
            body["nextPageToken"] = str(next_page_token + limit)
        return body

    @api.get("/models/{name}")
    async def describe_default(name: str) -> list[dict[str, Any]]:
        return [describe(registry, registry.resolve(name))]

    @api.get("/models/{name}/{version}")
    async def describe_version(name: str, version: str) -> list[dict[str, Any]]:
        if version == "all":
            registry.resolve(name)
            return [describe(registry, mv) for mv in registry.models[name].values()]
        return [describe(registry, registry.resolve(name, version))]

    @api.get("/v1/models/{name}")
    async def kserve_ready(name: str) -> dict[str, Any]:
        mv = registry.resolve(name)
        return {"name": name, "ready": mv.status is ModelStatus.READY}

    # -- register -------------------------------------------------------------------------------

    @api.post("/models", dependencies=[Depends(model_api)])
    async def register_model(
        request: Request,
        url: str | None = None,
        model_name: str | None = None,
        handler: str | None = None,
        runtime: str | None = None,
        batch_size: int | None = None,
        max_batch_delay: float | None = None,
        initial_workers: int | None = None,
        synchronous: bool | None = None,
        response_timeout: float | None = None,
        startup_timeout: float | None = None,
    ) -> JSONResponse:
        raw = {k: v for k, v in request.query_params.items()}
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
        params = RegisterParams.model_validate(raw)
        check_model_settings(params.model_dump())
        overrides = {
            key: value
            for key in ("batch_size", "max_batch_delay", "response_timeout", "startup_timeout")
            if (value := getattr(params, key)) is not None
        }
        if params.handler is not None:
            overrides["handler"] = params.handler
        try:
            mv = await registry.register(
                params.url,
                name=params.model_name,
                overrides=overrides,
                initial_workers=params.initial_workers,
                synchronous=params.synchronous,
            )
        except ConfigError as exc:  # a bad setting from the request, mapped at the boundary
            raise BadRequest(exc.message) from None
        if not params.synchronous:
            return _status("Processing worker updates...", 202)
        return _status(
            f'Model "{mv.name}" Version: {mv.version} registered with '
            f"{mv.ready_workers} initial workers"
        )

    # -- scale and tune -------------------------------------------------------------------------

    async def scale(mv: ModelVersion, params: ScaleParams) -> None:
        async with lock_for(mv):
            if (
                params.batch_size is not None
                or params.max_batch_delay is not None
                or params.response_timeout is not None
            ):
                mv.configure(
                    batch_size=params.batch_size,
                    max_batch_delay_ms=params.max_batch_delay,
                    response_timeout_s=params.response_timeout,
                )
            if params.min_worker is not None:
                await mv.scale(params.min_worker, params.max_worker)

    async def scale_route(
        name: str,
        version: str | None,
        min_worker: int | None,
        max_worker: int | None,
        synchronous: bool,
        timeout: float,
        batch_size: int | None,
        max_batch_delay: float | None,
        response_timeout: float | None,
    ) -> JSONResponse:
        mv = registry.resolve(name, version)
        if not (math.isfinite(timeout) and -1 <= timeout <= MAX_TIMEOUT_S):
            raise BadRequest(f"timeout must be -1 to {MAX_TIMEOUT_S:g} seconds, got {timeout}")
        tuning = (batch_size, max_batch_delay, response_timeout)
        if min_worker is None and all(v is None for v in tuning):
            min_worker = 1  # TorchServe's default
        if min_worker is not None and max_worker is None:
            max_worker = max(min_worker, 0)
        if min_worker is None and max_worker is not None:
            raise BadRequest("max_worker needs min_worker")
        if max_worker is not None and min_worker is not None and max_worker < min_worker:
            raise BadRequest(
                f"max_worker ({max_worker}) cannot be less than min_worker ({min_worker})"
            )
        check_model_settings(
            {
                "min_worker": min_worker,
                "max_worker": max_worker,
                "batch_size": batch_size,
                "max_batch_delay": max_batch_delay,
                "response_timeout": response_timeout,
            }
        )
        params = ScaleParams(
            min_worker=min_worker,
            max_worker=max_worker,
            synchronous=synchronous,
            timeout=timeout,
            batch_size=batch_size,
            max_batch_delay=max_batch_delay,
            response_timeout=response_timeout,
        )
        if not synchronous:
            task = asyncio.ensure_future(scale(mv, params))
            _background.add(task)
            task.add_done_callback(_scale_done)
            return _status("Processing worker updates...", 202)
        await scale(mv, params)
        if min_worker is None:
            return _status(f"Model {mv.name} version {mv.version} updated")
        ready = mv.ready_workers
        if ready < min_worker:
            return _status(
                f"Workers scaled to {ready} of {min_worker} for model: {mv.name}; "
                f"{mv.load_error or 'some workers failed to start'}",
                206,
            )
        return _status(f"Workers scaled to {min_worker} for model: {mv.name}")

    @api.put("/models/{name}")
    @api.put("/models/{name}/{version}")
    async def scale_model(
        name: str,
        version: str | None = None,
        min_worker: int | None = None,
        max_worker: int | None = None,
        synchronous: bool = False,
        timeout: float = -1,
        batch_size: int | None = None,
        max_batch_delay: float | None = None,
        response_timeout: float | None = None,
    ) -> JSONResponse:
        return await scale_route(
            name, version, min_worker, max_worker, synchronous, timeout,
            batch_size, max_batch_delay, response_timeout,
        )  # fmt: skip

    # -- default version, unregister ------------------------------------------------------------

    @api.put("/models/{name}/{version}/set-default")
    async def set_default(name: str, version: str) -> JSONResponse:
        registry.set_default(name, version)
        return _status(f'Default version successfully updated for model "{name}" to "{version}"')

    async def unregister(name: str, version: str | None) -> JSONResponse:
        versions = registry.models.get(name) or {}
        target = versions.get(version if version is not None else registry.defaults.get(name, ""))
        if target is None:
            # Unknown model (404) or version (400, as TorchServe): the registry says which.
            await registry.unregister(name, version, config.unregister_model_timeout_s)
            raise NotFound(f"Model not found: {name}")
        async with lock_for(target):
            await registry.unregister(name, target.version, config.unregister_model_timeout_s)
        return _status(f'Model "{name}" unregistered')

    @api.delete("/models/{name}", dependencies=[Depends(model_api)])
    async def unregister_default(name: str) -> JSONResponse:
        return await unregister(name, None)

    @api.delete("/models/{name}/{version}", dependencies=[Depends(model_api)])
    async def unregister_version(name: str, version: str) -> JSONResponse:
        return await unregister(name, version)

    app.include_router(api)

    # -- keys and API description (outside the management-key router) --------------------------

    @app.get("/token")
    async def rotate_token(request: Request, type: str = "management") -> dict[str, Any]:
        if auth is None:
            raise NotFound("Token authorization is disabled on this server")
        auth.check(request.headers.get("authorization"), "API")
        return auth.rotate(type)

    @app.options("/")
    async def api_description() -> dict[str, Any]:
        return app.openapi()

    document_management(app)  # every status each route answers, not just FastAPI's 200/422
    return app


def _scale_done(task: asyncio.Task) -> None:
    _background.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("scaling failed", exc_info=task.exception())
