"""The management listener (default 8081), TorchServe-compatible.

This first cut lists and describes models; registration, scaling, set-default and unregister
build on the same registry.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from torchbay.server.config import ServerConfig
from torchbay.server.errors import BadRequest, TorchbayError
from torchbay.server.model import ModelVersion
from torchbay.server.registry import ModelRegistry


def describe(registry: ModelRegistry, mv: ModelVersion) -> dict[str, Any]:
    """TorchServe's describe-model object, plus what torchbay knows beyond it."""
    s = mv.settings
    config = registry.model_configs.get(mv.key)
    info = getattr(mv.manifest, "torchbay", None)
    workers = []
    for slot in mv.slots:
        w = slot.worker
        workers.append(
            {
                "id": str(w.id if w else slot.index),
                "startTime": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(w.start_time))
                if w
                else None,
                "status": slot.state.value,
                "memoryUsage": 0,
                "pid": w.pid if w else None,
                "gpu": slot.placement.gpu_id is not None,
                "gpuUsage": "N/A",
                "device": w.device if w else None,
                "threads": slot.placement.threads,
                "restarts": slot.restarts,
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
        "loadedAtStartup": True,
        "isDefault": registry.is_default(mv),
        "workers": workers,
        "jobQueueStatus": {
            "remainingCapacity": mv.queue.remaining_capacity,
            "pendingRequests": len(mv.queue),
        },
        "format": getattr(info, "format", None),
        "precision": getattr(info, "precision", None),
    }


def build_management_app(registry: ModelRegistry, config: ServerConfig) -> FastAPI:
    app = FastAPI(title="torchbay management", docs_url=None, redoc_url=None)

    @app.exception_handler(TorchbayError)
    async def _torchbay_error(request: Request, exc: TorchbayError) -> JSONResponse:
        return JSONResponse(exc.to_json(), status_code=exc.status, headers=exc.headers or None)

    @app.get("/models")
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

    @app.get("/models/{name}")
    async def describe_default(name: str) -> list[dict[str, Any]]:
        return [describe(registry, registry.resolve(name))]

    @app.get("/models/{name}/{version}")
    async def describe_version(name: str, version: str) -> list[dict[str, Any]]:
        if version == "all":
            registry.resolve(name)
            return [describe(registry, mv) for mv in registry.models[name].values()]
        return [describe(registry, registry.resolve(name, version))]

    return app
