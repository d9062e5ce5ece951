"""Build the three listeners' ASGI apps around one registry and one metrics registry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import make_asgi_app
from torchbay.server.http import ASGIApp
from torchbay.server.inference_app import InferenceApp
from torchbay.server.management import build_management_app
from torchbay.server.metrics import ServerMetrics
from torchbay.server.registry import ModelRegistry

from torchbay import __version__

if TYPE_CHECKING:
    from torchbay.server.serve import TorchbayServer


@dataclass
class Apps:
    registry: ModelRegistry
    metrics: ServerMetrics
    inference: ASGIApp
    management: ASGIApp
    metrics_app: ASGIApp


def build_apps(server: TorchbayServer) -> Apps:
    config = server.config
    metrics = ServerMetrics()
    registry = ModelRegistry(
        config,
        place=server.place,
        server_version=__version__,
        observer=metrics,
        worker_env=server.env or None,
    )
    inference = InferenceApp(
        registry,
        max_request_size=config.max_request_size,
        server_version=__version__,
        on_request=metrics.request_done,
    )
    management = build_management_app(registry, config)
    return Apps(
        registry=registry,
        metrics=metrics,
        inference=inference,
        management=management,
        metrics_app=make_asgi_app(metrics.registry),
    )
