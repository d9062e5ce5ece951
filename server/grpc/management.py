"""TorchServe's ``org.pytorch.serve.grpc.management.ManagementAPIsService``.

Each RPC runs the code the HTTP management route runs (``http/model_routes.py``) and answers
``ManagementResponse{msg}`` with the JSON text that route answers; its errors are the same
errors as gRPC statuses. As TorchServe's gRPC API: a zero number is "not given" (proto3 cannot
tell), register and unregister with the model API disabled are PERMISSION_DENIED, and every RPC
needs the management key when token authorization is on.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from torchbay.server.errors import BadRequest, MethodNotAllowed, TorchbayError
from torchbay.server.grpc.calls import Calls, Service
from torchbay.server.grpc.messages import TS_MANAGEMENT_SERVICE, message
from torchbay.server.grpc.status import RpcError, abort, from_error
from torchbay.server.http import model_routes as routes
from torchbay.server.http.management import _validation_message

_RESPONSE = "org.pytorch.serve.grpc.management.ManagementResponse"
_REGISTER_FIELDS = (
    "url", "model_name", "handler", "runtime", "batch_size", "max_batch_delay",
    "initial_workers", "response_timeout", "startup_timeout",
)  # fmt: skip


def _text(result: Any) -> str:
    """A route's answer as the JSON text the HTTP API sends."""
    if isinstance(result, JSONResponse):
        return bytes(result.body).decode()
    return json.dumps(result, ensure_ascii=False, separators=(",", ":"))


class TorchServeManagement(Service):
    name = TS_MANAGEMENT_SERVICE
    rpcs = (
        "DescribeModel",
        "ListModels",
        "RegisterModel",
        "ScaleWorker",
        "SetDefault",
        "UnregisterModel",
    )

    def __init__(self, calls: Calls, state: routes.Management) -> None:
        super().__init__(calls)
        self.state = state

    async def _answer(
        self, context: grpc.aio.ServicerContext, work: Callable[[], Awaitable[Any]]
    ) -> Any:
        """Check the management key, run ``work``, answer its JSON text or its error."""
        try:
            self.calls.authorize(context, "management")
            result = await work()
        except RpcError as exc:
            await abort(context, exc)
        except MethodNotAllowed as exc:  # the model API is off: TorchServe's PERMISSION_DENIED
            await abort(context, RpcError(grpc.StatusCode.PERMISSION_DENIED, exc.message, 403))
        except TorchbayError as exc:
            await abort(context, from_error(exc))
        except ValidationError as exc:
            await abort(context, from_error(BadRequest(_validation_message(exc))))
        return message(_RESPONSE)(msg=_text(result))

    async def describe_model(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        state, name, version = self.state, request.model_name, request.model_version
        if version:
            return await self._answer(
                context, lambda: routes.describe_version(state, name, version)
            )
        return await self._answer(context, lambda: routes.describe_default(state, name))

    async def list_models(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        limit, token = request.limit or 100, request.next_page_token
        return await self._answer(context, lambda: routes.list_models(self.state, limit, token))

    async def register_model(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._answer(context, lambda: self._register(request))

    async def _register(self, request: Any) -> JSONResponse:
        routes.model_api(self.state)
        given = {key: getattr(request, key) or None for key in _REGISTER_FIELDS}
        if not given["url"]:
            raise BadRequest("Parameter url is required.")
        params = routes.RegisterParams.model_validate(
            {k: v for k, v in given.items() if v is not None} | {"synchronous": request.synchronous}
        )
        return await routes.register(self.state, params)

    async def scale_worker(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        def work() -> Awaitable[JSONResponse]:
            return routes.scale_model(
                self.state,
                request.model_name,
                request.model_version or None,
                min_worker=request.min_worker or 1,
                max_worker=request.max_worker or None,
                synchronous=request.synchronous,
                timeout=request.timeout or -1,
            )

        return await self._answer(context, work)

    async def set_default(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        name, version = request.model_name, request.model_version
        return await self._answer(context, lambda: routes.set_default(self.state, name, version))

    async def unregister_model(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._answer(context, lambda: self._unregister(request))

    async def _unregister(self, request: Any) -> JSONResponse:
        routes.model_api(self.state)
        if not request.model_name:
            raise BadRequest("Parameter model_name is required.")
        return await routes._unregister(
            self.state, request.model_name, request.model_version or None
        )
