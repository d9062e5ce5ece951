"""grpc's health checking protocol, ``grpc.health.v1.Health``, on the inference listener, as
Triton serves it on its gRPC port: what Kubernetes' gRPC probes, ``grpc_health_probe`` and load
balancers ask.

``Check`` answers SERVING while the server is ready (OIP's ServerReady: its start-up models are
in and it is not stopping), NOT_SERVING otherwise, for the service ``""`` (the server) or one of
the inference listener's services; any other name is NOT_FOUND, as the protocol says. ``Watch``
is not served: UNIMPLEMENTED, which the protocol tells clients not to retry. No key is needed,
as for ServerLive and ServerReady. Torch-free.
"""

from __future__ import annotations

from typing import Any

import grpc

from torchbay.server.grpc.calls import Service
from torchbay.server.grpc.messages import HEALTH_SERVICE, OIP_SERVICE, TS_INFERENCE_SERVICE, message
from torchbay.server.grpc.status import RpcError, abort

_RESPONSE = "grpc.health.v1.HealthCheckResponse"
# The names a client may ask about: the whole server, and each service of the listener.
KNOWN = frozenset(("", HEALTH_SERVICE, OIP_SERVICE, TS_INFERENCE_SERVICE))


class HealthService(Service):
    name = HEALTH_SERVICE
    rpcs = ("Check",)

    async def check(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if request.service not in KNOWN:
            unknown = RpcError(grpc.StatusCode.NOT_FOUND, f"Unknown service {request.service!r}")
            await abort(context, unknown)
        response = message(_RESPONSE)
        ready = self.calls.plane.ready()
        return response(status=response.SERVING if ready else response.NOT_SERVING)
