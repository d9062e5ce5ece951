"""One listener for inference and management when both name the same address (TorchServe's
``ConnectorType.BOTH``; KServe's TorchServe config sets ``inference_address`` and
``management_address`` to the same ``http://0.0.0.0:8085``).

The management paths (``/models...``, ``/workflows...``, ``/token`` and the KServe v1 readiness
``GET /v1/models/{m}``) go to the management app; everything else (predictions, ``/wfpredict``,
``/v1/models/{m}:predict``, ``/v2``, ``/ping``, the OpenAPI description) goes to the inference app.
Each app keeps its own token check. Port 0 never counts as shared: two ``:0`` listeners are two
ephemeral ports.
"""

from __future__ import annotations

from torchbay.server.config.settings import parse_address
from torchbay.server.http.asgi import ASGIApp, Receive, Scope, Send


def is_management_path(method: str, path: str) -> bool:
    bare = path.rstrip("/")  # TorchServe splits the path as Java does: trailing slashes dropped
    if bare.startswith("/models/") and bare.endswith("/invoke") and bare.count("/") == 3:
        return False  # SageMaker's /models/{m}/invoke is inference (TorchServe's order too)
    if path == "/token" or path == "/models" or path.startswith("/models/"):
        return True
    if path == "/workflows" or path.startswith("/workflows/"):  # TorchServe's workflow API
        return True
    # KServe v1 model readiness lives on TorchServe's management API; :predict is inference.
    return method == "GET" and path.startswith("/v1/models/") and ":" not in path


class CombinedApp:
    """Route each HTTP request to the management or the inference app by its path."""

    def __init__(self, inference: ASGIApp, management: ASGIApp) -> None:
        self.inference = inference
        self.management = management

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and is_management_path(scope["method"], scope["path"]):
            await self.management(scope, receive, send)
        else:
            await self.inference(scope, receive, send)


def same_address(a: str, b: str) -> bool:
    """Both addresses name one fixed host:port (and scheme), so only one socket can bind it."""
    first, second = parse_address(a), parse_address(b)
    return first.port != 0 and first == second
