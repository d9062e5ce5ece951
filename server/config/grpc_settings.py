"""The gRPC listeners' settings (TorchServe's keys and defaults), a base of ``ServerConfig``.

TorchServe serves gRPC on ``grpc_inference_address:grpc_inference_port`` (127.0.0.1:7070) and
``grpc_management_address:grpc_management_port`` (127.0.0.1:7071), always (it has no off
switch); ``enable_grpc_ssl`` uses ``private_key_file`` / ``certificate_file`` (checked by
``ServerConfig``); the ``*_max_connection_age[_grace]_ms`` keys become grpc's channel options of
those names (unset: connections live as long as the client wants, TorchServe's Long.MAX_VALUE).
Port 0 binds any free port (tests). Torch-free; imports nothing of ours.
"""

from __future__ import annotations

import ipaddress
import re

from pydantic import BaseModel, Field, field_validator

MAX_AGE_MS = 365 * 86_400_000  # a year: far above any real setting
_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9\-.]{0,252})$")


class GrpcSettings(BaseModel):
    grpc_inference_address: str = "127.0.0.1"
    grpc_management_address: str = "127.0.0.1"
    grpc_inference_port: int = Field(7070, ge=0, le=65535)
    grpc_management_port: int = Field(7071, ge=0, le=65535)
    enable_grpc_ssl: bool = False
    grpc_inference_max_connection_age_ms: int | None = Field(None, ge=1, le=MAX_AGE_MS)
    grpc_management_max_connection_age_ms: int | None = Field(None, ge=1, le=MAX_AGE_MS)
    grpc_inference_max_connection_age_grace_ms: int | None = Field(None, ge=0, le=MAX_AGE_MS)
    grpc_management_max_connection_age_grace_ms: int | None = Field(None, ge=0, le=MAX_AGE_MS)

    @field_validator("grpc_inference_address", "grpc_management_address")
    @classmethod
    def _host(cls, value: str) -> str:
        """A bare IP address or host name, as TorchServe's keys take (no scheme, no port)."""
        host = value.strip().removeprefix("[").removesuffix("]")
        try:
            return str(ipaddress.ip_address(host))
        except ValueError:
            pass
        if not _HOSTNAME.match(host):
            raise ValueError(
                f"must be an IP address or host name (no scheme or port), got {value!r}"
            )
        return host
