"""TorchServe's ``org.pytorch.serve.grpc.management.ManagementAPIsService``.

Each RPC runs the plane's management operation that the HTTP route runs (``plane.management``)
and answers ``ManagementResponse{msg}`` as TorchServe 0.12's ManagementImpl does: describe and
list as the JSON text the HTTP API answers, the others as their status message alone (the
HTTP API's ``{"status": ...}`` without the object); its errors are the same errors as gRPC
statuses. As TorchServe's gRPC API (``GRPCUtils.getRegisterParam``): a number that is zero or
negative is "not given" (proto3 cannot tell zero from absent), register and unregister with the
model API disabled are PERMISSION_DENIED, and every RPC needs the management key when token
authorization is on. An operation runs to its end
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
    """An operation's answer as TorchServe's ``msg``: a status's message, else JSON text."""
    if isinstance(result, Status):
        return result.message
    return json.dumps(result, ensure_ascii=False, separators=(",", ":"))


def _given(value: int) -> int | None:
    """A number of a request message: zero or negative is not given (TorchServe's)."""
    return value if value > 0 else None


def _register_params(request: Any) -> Any:
    """The request's register parameters: each message field RegisterParams knows (an empty
    string, false, or a number below 1 is not given), and ``synchronous`` as it is."""
    given = {
        f.name: _given(value) if type(value) is int else value or None
        for f in request.DESCRIPTOR.fields
        if f.name in RegisterParams.model_fields and f.name != "synchronous"
        for value in (getattr(request, f.name),)
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
        customized = request.customized
        return await self._answer(
            context, lambda: plane.describe(self.state, name, version, customized)
        )

    async def list_models(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        limit, token = _given(request.limit) or 100, request.next_page_token
        return await self._answer(context, lambda: plane.list_models(self.state, limit, token))

    async def register_model(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._answer(context, lambda: self._register(request))

    async def _register(self, request: Any) -> Status:
        plane.require_model_api(self.state)
        return await plane.register(self.state, _register_params(request))

    async def scale_worker(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        raw = {
            "min_worker": _given(request.min_worker) or 1,
            "max_worker": _given(request.max_worker),
            "synchronous": request.synchronous,
            "timeout": _given(request.timeout) or -1,
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
