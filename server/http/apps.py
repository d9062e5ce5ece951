"""Build the three listeners' ASGI apps around one data plane (its registry and recorders)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.middleware.cors import CORSMiddleware

from torchbay import __version__
from torchbay.server.http.asgi import ASGIApp
from torchbay.server.http.auth import TokenAuth
from torchbay.server.http.inference import InferenceApp
from torchbay.server.http.limits import AtHeaders
from torchbay.server.http.management import build_management_app
from torchbay.server.http.openapi import inference_openapi, metrics_openapi, with_openapi
from torchbay.server.observe.ts_metrics import counting, counting_answers
from torchbay.server.observe.ts_metrics import metrics_app as ts_metrics_app
from torchbay.server.plane import DataPlane
from torchbay.server.workflows.manager import Workflows


@dataclass
class Apps:
    plane: DataPlane
    inference: ASGIApp
    management: ASGIApp
    metrics_app: ASGIApp
    # The inference listener's refusals from the headers alone (http.early); None with CORS,
    # whose headers only the ASGI path adds.
    at_headers: AtHeaders | None = None
    auth: TokenAuth | None = None  # None: token authorization disabled
    workflows: Workflows | None = None  # the registered workflows (server/workflows)

    @property
    def registry(self) -> Any:
        return self.plane.registry

    @property
    def metrics(self) -> Any:
        return self.plane.metrics


def build_apps(config: Any, plane: DataPlane) -> Apps:
    """Every HTTP listener's app over the server's one data plane (built by ``serve.py``)."""
    metrics = plane.metrics
    auth = None
    if not config.disable_token_authorization:
        auth = TokenAuth(
            config.key_file, config.token_expiration_min, keys_file=config.token_keys_file
        )
        auth.write_key_file()
    workflows = Workflows(plane)  # TorchServe's workflows (server/workflows)
    plane.snapshots.skip = workflows.serves  # no workflow in a config snapshot, as TorchServe
    inference = InferenceApp(
        plane,
        max_request_size=config.max_request_size,
        authorize=auth.authorize if auth is not None else None,
        openapi=inference_openapi(__version__),
        workflows=workflows,
    )
    # TorchServe's Requests2XX/4XX/5XX count every answer of both listeners; its series are
    # written as TorchServe writes them (observe.ts_metrics).
    at_headers = counting_answers(inference.at_headers, metrics)
    inference = counting(inference, metrics)
    management_app = build_management_app(plane, config, auth=auth, workflows=workflows)
    management = counting(management_app, metrics)
    # The metrics listener's answers count too: TorchServe's sendHttpResponse counts them all.
    metrics_app = counting(
        with_openapi(ts_metrics_app(metrics), metrics_openapi(__version__)), metrics
    )
    return Apps(
        plane=plane,
        inference=with_cors(inference, config),
        management=with_cors(management, config),
        metrics_app=with_cors(metrics_app, config),
        at_headers=None if config.cors_allowed_origin else at_headers,
        auth=auth,
        workflows=workflows,
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
