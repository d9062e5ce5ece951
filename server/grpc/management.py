"""TorchServe's ``org.pytorch.serve.grpc.management.ManagementAPIsService``.

Each RPC runs the plane's management operation that the HTTP route runs (``plane.management``)
and answers ``ManagementResponse{msg}`` with the JSON text the HTTP API answers; its errors are
the same errors as gRPC statuses. As TorchServe's gRPC API: a zero number is "not given" (proto3
cannot tell), register and unregister with the model API disabled are PERMISSION_DENIED, and
every RPC needs the management key when token authorization is on. An operation runs to its end
when its call is cancelled (a client's deadline), as over REST (``calls.to_the_end``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from pydantic import ValidationError

from torchbay.server.errors import BadRequest, MethodNotAllowed, TorchbayError
from torchbay.server.grpc.calls import Calls, Service, to_the_end
from torchbay.server.grpc.messages import TS_MANAGEMENT_SERVICE, message
from torchbay.server.grpc.status import RpcError, abort, from_error
from torchbay.server.plane import management as plane
from torchbay.server.plane.management import Management, Status
from torchbay.server.plane.params import RegisterParams, check_runtime, validation_message

_RESPONSE = "org.pytorch.serve.grpc.management.ManagementResponse"


def _text(result: Any) -> str:
    """An operation's answer as the JSON text the HTTP API sends."""
    body = result.body if isinstance(result, Status) else result
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


def _register_params(request: Any) -> Any:
    """The request's register parameters: each message field RegisterParams knows (a zero or
    empty one is not given), and ``synchronous`` as it is."""
    given = {
        f.name: getattr(request, f.name) or None
        for f in request.DESCRIPTOR.fields
        if f.name in RegisterParams.model_fields and f.name != "synchronous"
    }
    if not given.get("url"):
        raise BadRequest("Parameter url is required.")
    check_runtime(given.get("runtime"))
    return RegisterParams.model_validate(
        {k: v for k, v in given.items() if v is not None} | {"synchronous": request.synchronous}
    )


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

    def __init__(self, calls: Calls, state: Management) -> None:
        super().__init__(calls)
        self.state = state

    async def _answer(
        self, context: grpc.aio.ServicerContext, work: Callable[[], Awaitable[Any] | Any]
    ) -> Any:
        """Check the management key, run ``work``, answer its JSON text or its error."""
        try:
            self.calls.authorize(context, "management")
            result = work()
            if isinstance(result, Awaitable):  # not stopped half-way by a call cancelled
                result = await to_the_end(result)
        except RpcError as exc:
            await abort(context, exc)
        except MethodNotAllowed as exc:  # the model API is off: TorchServe's PERMISSION_DENIED
            await abort(context, RpcError(grpc.StatusCode.PERMISSION_DENIED, exc.message, 403))
        except TorchbayError as exc:
            await abort(context, from_error(exc))
        except ValidationError as exc:
            await abort(context, from_error(BadRequest(validation_message(exc))))
        return message(_RESPONSE)(msg=_text(result))

    async def describe_model(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        name, version = request.model_name, request.model_version or None
        return await self._answer(context, lambda: plane.describe(self.state, name, version))

    async def list_models(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        limit, token = request.limit or 100, request.next_page_token
        return await self._answer(context, lambda: plane.list_models(self.state, limit, token))

    async def register_model(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._answer(context, lambda: self._register(request))

    async def _register(self, request: Any) -> Status:
        plane.require_model_api(self.state)
        return await plane.register(self.state, _register_params(request))

    async def scale_worker(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        raw = {
            "min_worker": request.min_worker or 1,
            "max_worker": request.max_worker or None,
            "synchronous": request.synchronous,
            "timeout": request.timeout or -1,
        }
        name, version = request.model_name, request.model_version or None
        return await self._answer(context, lambda: plane.scale(self.state, name, version, raw))

    async def set_default(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        name, version = request.model_name, request.model_version
        return await self._answer(context, lambda: plane.set_default(self.state, name, version))

    async def unregister_model(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._answer(context, lambda: self._unregister(request))

    async def _unregister(self, request: Any) -> Status:
        plane.require_model_api(self.state)
        if not request.model_name:
            raise BadRequest("Parameter model_name is required.")
        return await plane.unregister(self.state, request.model_name, request.model_version or None)
