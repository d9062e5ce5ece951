"""The Open Inference Protocol's model metadata and the Triton extensions, over REST: the
adapter between the inference listener's routes (``route_table.INFERENCE_ROUTES``, dispatched by
``InferenceApp``) and the data plane's model operations (``plane/models.py``):

* model metadata ``GET /v2/models/{m}[/versions/{v}]``;
* statistics ``GET /v2/models[/{m}[/versions/{v}]]/stats``;
* model configuration ``GET /v2/models/{m}[/versions/{v}]/config``;
* model repository ``POST /v2/repository/index``, ``.../models/{m}/load``, ``.../unload``;
* logging ``GET``/``POST /v2/logging`` (``plane/log_settings.py``);
* trace ``GET``/``POST /v2[/models/{m}]/trace/setting`` (``plane/trace.py``).

Metadata, configuration and statistics need the inference key; the repository, the log and the
trace settings the management key (token authorization on). Errors are OIP's ``{"error": ...}``.
Torch-free.
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
MAX_CONTROL_BODY = 1 << 20  # repository requests carry a small JSON object


def _params(match: Match) -> tuple[str | None, str | None]:
    groups = match.groupdict()
    name, version = groups.get("model_name"), groups.get("model_version")
    return name, version  # the path is decoded already (uvicorn): decoding again is wrong


async def _json_body(scope: Scope, receive: Receive) -> dict[str, Any]:
    """The request's JSON object; an empty body is ``{}``. BadRequest otherwise."""
    body = await read_body(scope, receive, MAX_CONTROL_BODY)
    if not body.strip():
        return {}
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise BadRequest("The request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise BadRequest("The request body must be a JSON object")
    return data


class TritonApi:
    """The endpoints of this module over one data plane."""

    def __init__(self, plane: DataPlane, *, authorize: AuthHook | None = None) -> None:
        self.plane = plane
        self.models = plane.models
        self.authorize = authorize

    def _check(self, scope: Scope, kind: str) -> None:
        if self.authorize is not None:
            self.authorize(scope, kind)

    def _model(self, scope: Scope, match: Match) -> tuple[str, str | None]:
        self._check(scope, "inference")
        name, version = _params(match)
        assert name is not None
        return name, version

    async def model_metadata(self, scope: Scope, receive: Receive, send: Send, m: Match) -> None:
        await send_json(send, 200, self.models.metadata(*self._model(scope, m)))

    async def model_config(self, scope: Scope, receive: Receive, send: Send, m: Match) -> None:
        await send_json(send, 200, self.models.config(*self._model(scope, m)))

    async def model_stats(self, scope: Scope, receive: Receive, send: Send, m: Match) -> None:
        self._check(scope, "inference")
        await send_json(send, 200, self.models.statistics(*_params(m)))

    async def log_settings(self, scope: Scope, receive: Receive, send: Send, m: Match) -> None:
        self._check(scope, "management")
        changes = await _json_body(scope, receive) if scope["method"] == "POST" else None
        await send_json(send, 200, self.plane.log_settings(changes))

    async def trace_settings(self, scope: Scope, receive: Receive, send: Send, m: Match) -> None:
        self._check(scope, "management")
        changes = await _json_body(scope, receive) if scope["method"] == "POST" else None
        await send_json(send, 200, self.plane.trace_settings(_params(m)[0], changes))

    async def repository_index(self, scope: Scope, receive: Receive, send: Send, m: Match) -> None:
        self._check(scope, "management")
        ready_only = (await _json_body(scope, receive)).get("ready", False)
        await send_json(send, 200, await self.models.index(ready_only))

    async def repository_load(self, scope: Scope, receive: Receive, send: Send, m: Match) -> None:
        self._check(scope, "management")
        self.models.control()
        name, _ = _params(m)
        assert name is not None
        body = await _json_body(scope, receive)
        await self.models.load(name, body.get("parameters"))
        await send_json(send, 200, {})

    async def repository_unload(self, scope: Scope, receive: Receive, send: Send, m: Match) -> None:
        self._check(scope, "management")
        self.models.control()
        name, _ = _params(m)
        assert name is not None
        body = await _json_body(scope, receive)
        parameters = body.get("parameters")
        await self.models.unload(name, {} if parameters is None else parameters)
        await send_json(send, 200, {})
