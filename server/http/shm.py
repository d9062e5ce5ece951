"""Triton's shared-memory extensions over REST: the adapter between the routes of
``http/shm_routes.py`` and the data plane's region registry (``plane/shm.py``).

Status needs the inference key, register and unregister the management key (token
authorization on). Errors are OIP's ``{"error": ...}``, in Triton's words. Torch-free.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from torchbay.server.errors import BadRequest
from torchbay.server.http.asgi import Receive, Scope, Send, read_body, send_json
from torchbay.server.plane import DataPlane

Match = re.Match[str]
AuthHook = Callable[[Scope, str], None]
MAX_BODY = 64 << 10  # a register request is a small JSON object


async def _object(scope: Scope, receive: Receive) -> dict[str, Any]:
    body = await read_body(scope, receive, MAX_BODY)
    try:
        data = json.loads(body) if body.strip() else None
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        raise BadRequest("failed to parse the request JSON buffer: a JSON object is expected")
    return data


def _region(match: Match) -> str | None:
    name = match.groupdict().get("region_name")
    return name  # the path is decoded already (uvicorn)


class SharedMemoryApi:
    """The endpoints of the shared-memory routes over one data plane."""

    def __init__(self, plane: DataPlane, *, authorize: AuthHook | None = None) -> None:
        self.shm = plane.shm
        self.authorize = authorize

    def _check(self, scope: Scope, kind: str) -> None:
        if self.authorize is not None:
            self.authorize(scope, kind)

    async def shm_status(self, scope: Scope, receive: Receive, send: Send, m: Match) -> None:
        self._check(scope, "inference")
        await send_json(send, 200, self.shm.status("system", _region(m)))

    async def shm_register(self, scope: Scope, receive: Receive, send: Send, m: Match) -> None:
        self._check(scope, "management")
        body = await _object(scope, receive)
        name = _region(m) or ""
        self.shm.register_system(
            name, body.get("key"), body.get("offset", 0), body.get("byte_size")
        )
        await send_json(send, 200, {})

    async def shm_unregister(self, scope: Scope, receive: Receive, send: Send, m: Match) -> None:
        self._check(scope, "management")
        self.shm.unregister("system", _region(m))
        await send_json(send, 200, {})

    async def cuda_shm_status(self, scope: Scope, receive: Receive, send: Send, m: Match) -> None:
        self._check(scope, "inference")
        await send_json(send, 200, self.shm.status("cuda", _region(m)))

    async def cuda_shm_register(self, scope: Scope, receive: Receive, send: Send, m: Match) -> None:
        self._check(scope, "management")
        body = await _object(scope, receive)
        handle = body.get("raw_handle")
        self.shm.register_cuda(
            _region(m) or "", handle, body.get("device_id"), body.get("byte_size")
        )
        await send_json(send, 200, {})

    async def cuda_shm_unregister(
        self, scope: Scope, receive: Receive, send: Send, m: Match
    ) -> None:
        self._check(scope, "management")
        self.shm.unregister("cuda", _region(m))
        await send_json(send, 200, {})
