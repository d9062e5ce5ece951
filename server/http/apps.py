"""Build the three listeners' ASGI apps around one registry and one metrics registry."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.middleware.cors import CORSMiddleware

from torchbay import __version__
from torchbay.server.http.asgi import ASGIApp
from torchbay.server.http.auth import TokenAuth
from torchbay.server.http.inference import InferenceApp
from torchbay.server.http.limits import AtHeaders
from torchbay.server.http.management import build_management_app
from torchbay.server.http.openapi import inference_openapi, metrics_openapi, with_openapi
from torchbay.server.http.triton import TritonApi
from torchbay.server.observe.logs import request_hook
from torchbay.server.observe.metrics import ServerMetrics
from torchbay.server.observe.oip_stats import Observers, OipStats, chain
from torchbay.server.observe.ts_metrics import counting, counting_answers
from torchbay.server.observe.ts_metrics import metrics_app as ts_metrics_app
from torchbay.server.plane.management import Management
from torchbay.server.serving.fetch import Fetcher
from torchbay.server.serving.registry import ModelRegistry


class TorchbayServer(Protocol):
    """What the apps are built from (serve.TorchbayServer; not imported: serve imports us)."""

    config: Any  # ServerConfig
    env: Mapping[str, str]
    place: Any
    budget: Any  # serving.budget.HostBudget
    take_prewarmed: Any


@dataclass
class Apps:
    registry: ModelRegistry
    metrics: ServerMetrics
    inference: ASGIApp
    management: ASGIApp
    metrics_app: ASGIApp
    # The inference listener's refusals from the headers alone (http.early); None with CORS,
    # whose headers only the ASGI path adds.
    at_headers: AtHeaders | None = None
    auth: TokenAuth | None = None  # None: token authorization disabled
    management_state: Management | None = None  # what the gRPC management service shares


def build_apps(server: TorchbayServer) -> Apps:
    config = server.config
    metrics = ServerMetrics(system_metrics=not config.disable_system_metrics)
    stats = OipStats()  # Triton's statistics extension: fed by the same records as the metrics
    registry = ModelRegistry(
        config,
        place=server.place,
        budget=server.budget,
        server_version=__version__,
        observer=Observers(metrics, stats),
        worker_env=server.env or None,
        prewarmed=server.take_prewarmed,
    )
    metrics.watch(registry)
    # URL registration: only allowed_urls (none by default), into the registry's own work folder.
    registry.fetch = Fetcher(
        config.allowed_urls,
        registry.workdir / "downloads",
        max_bytes=config.max_download_size,
        timeout_s=config.download_timeout_s,
    )
    auth = None
    if not config.disable_token_authorization:
        auth = TokenAuth(
            config.key_file, config.token_expiration_min, keys_file=config.token_keys_file
        )
        auth.write_key_file()
    inference = InferenceApp(
        registry,
        max_request_size=config.max_request_size,
        server_version=__version__,
        on_request=request_hook(chain(metrics.request_done, stats.request_done)),
        authorize=auth.authorize if auth is not None else None,
        openapi=inference_openapi(__version__),
        triton=TritonApi(
            registry,
            stats=stats,
            authorize=auth.authorize if auth is not None else None,
            model_api=config.enable_model_api,
            unload_timeout_s=config.unregister_model_timeout_s,
        ),
    )
    # TorchServe's Requests2XX/4XX/5XX count every answer of both listeners; its series are
    # written as TorchServe writes them (observe.ts_metrics).
    at_headers = counting_answers(inference.at_headers, metrics)
    inference = counting(inference, metrics)
    management_app = build_management_app(registry, config, auth=auth)
    management = counting(management_app, metrics)
    metrics_app = with_openapi(ts_metrics_app(metrics), metrics_openapi(__version__))
    return Apps(
        registry=registry,
        metrics=metrics,
        inference=with_cors(inference, config),
        management=with_cors(management, config),
        metrics_app=with_cors(metrics_app, config),
        at_headers=None if config.cors_allowed_origin else at_headers,
        auth=auth,
        management_state=management_app.state.management,
    )


def with_cors(app: ASGIApp, config: Any) -> ASGIApp:
    """``app`` behind starlette's CORSMiddleware when ``cors_allowed_origin`` is set
    (TorchServe's comma-separated ``cors_allowed_*`` keys); else ``app`` itself."""
    if not config.cors_allowed_origin:
        return app

    def split(value: str | None) -> list[str]:
        return [part.strip() for part in (value or "").split(",") if part.strip()]

    return CORSMiddleware(  # type: ignore[return-value]
        app,
        allow_origins=split(config.cors_allowed_origin),
        allow_methods=split(config.cors_allowed_methods) or ["GET"],
        allow_headers=split(config.cors_allowed_headers),
    )
