"""Triton's extensions over gRPC, on ``inference.GRPCInferenceService``: model configuration
(``ModelConfig``), statistics (``ModelStatistics``), the model repository (``RepositoryIndex``,
``RepositoryModelLoad``, ``RepositoryModelUnload``), logging (``LogSettings``) and trace
(``TraceSetting``).

Each RPC is the REST endpoint's adapter (``http/triton.py``) in gRPC's shape: the same data
plane operation (``plane/models.py``), the same keys (configuration and statistics the inference
key, the repository the management key), the same errors as gRPC statuses. The plane's answers
are Triton's JSON shapes, which are the protos' JSON mapping, so ``json_format`` turns them
into the messages. Torch-free.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import json_format

from torchbay.server.errors import BadRequest, MethodNotAllowed, TorchbayError
from torchbay.server.grpc.calls import Service, to_the_end
from torchbay.server.grpc.messages import message
from torchbay.server.grpc.status import RpcError, abort, from_error
from torchbay.server.grpc.tensors import parameters_json

# Each RPC of this module and the plane operation it serves (for ServerMetadata's extensions).
OPERATIONS = {
    "ModelConfig": "model_config",
    "ModelStatistics": "model_stats",
    "RepositoryIndex": "repository_index",
    "RepositoryModelLoad": "repository_load",
    "RepositoryModelUnload": "repository_unload",
    "LogSettings": "log_settings",
    "TraceSetting": "trace_settings",
}


def _config_message(config: dict[str, Any]) -> Any:
    """A ModelConfig message from the plane's JSON: the proto's versions are numbers, so a
    version policy naming versions that are not (``1.0``) is left out."""
    policy = config.get("version_policy", {}).get("specific", {}).get("versions", [])
    if not all(str(v).isdigit() for v in policy):
        config = {k: v for k, v in config.items() if k != "version_policy"}
    try:
        return json_format.ParseDict(
            config, message("inference.ModelConfig")(), ignore_unknown_fields=True
        )
    except json_format.ParseError:  # control inputs a model-config.yaml wrote another way
        section = dict(config.get("sequence_batching") or {})
        if section.pop("control_input", None) is None:
            raise
        return _config_message({**config, "sequence_batching": section})


def _setting_value(message_class: Any, value: Any) -> Any:
    """A log setting as the proto's SettingValue (bool, uint32 or string)."""
    if isinstance(value, bool):
        return message_class(bool_param=value)
    if isinstance(value, int):
        return message_class(uint32_param=value)
    return message_class(string_param=str(value))


def _trace_changes(entries: Any) -> dict[str, Any]:
    """TraceSetting's map of string lists as the REST body's JSON object: no value is null (the
    setting is cleared), ``trace_level`` a list, another setting its one string (or the list,
    which the plane refuses as Triton does: one value expected)."""
    out: dict[str, Any] = {}
    for key, setting in entries.items():
        values = list(setting.value)
        if not values:
            out[key] = None
        elif key == "trace_level" or len(values) > 1:
            out[key] = values
        else:
            out[key] = values[0]
    return out


class TritonExtensions(Service):
    """The RPCs of this module; a part of the OIP service (``grpc/oip.py``)."""

    async def _run(
        self, context: grpc.aio.ServicerContext, kind: str, work: Callable[[], Awaitable[Any]]
    ) -> Any:
        """Check the ``kind`` key, run ``work``, answer its message or its error."""
        try:
            self.calls.authorize(context, kind)
            return await to_the_end(work())  # not stopped half-way by a call cancelled
        except RpcError as exc:
            await abort(context, exc)
        except MethodNotAllowed as exc:  # the model API is off
            await abort(context, RpcError(grpc.StatusCode.PERMISSION_DENIED, exc.message, 403))
        except TorchbayError as exc:
            await abort(context, from_error(exc, oip=True))

    async def model_config(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def work() -> Any:
            config = self.calls.plane.models.config(request.name, request.version or None)
            return message("inference.ModelConfigResponse")(config=_config_message(config))

        return await self._run(context, "inference", work)

    async def model_statistics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def work() -> Any:
            stats = self.calls.plane.models.statistics(request.name, request.version)
            return json_format.ParseDict(
                stats, message("inference.ModelStatisticsResponse")(), ignore_unknown_fields=True
            )

        return await self._run(context, "inference", work)

    async def log_settings(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Triton's LogSettings: an empty request reads them, one with settings changes them."""

        async def work() -> Any:
            settings = self.calls.plane.log_settings(parameters_json(request.settings) or None)
            response = message("inference.LogSettingsResponse")()
            value_class = message("inference.LogSettingsResponse.SettingValue")
            for key, value in settings.items():
                response.settings[key].CopyFrom(_setting_value(value_class, value))
            return response

        return await self._run(context, "management", work)

    async def trace_setting(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Triton's TraceSetting: an empty request reads them, one with settings changes them;
        ``model_name`` names a model's settings (else the global ones)."""

        async def work() -> Any:
            changes = _trace_changes(request.settings) if request.settings else None
            settings = self.calls.plane.trace_settings(request.model_name or None, changes)
            response = message("inference.TraceSettingResponse")()
            for key, value in settings.items():
                response.settings[key].value.extend(value if isinstance(value, list) else [value])
            return response

        return await self._run(context, "management", work)

    async def repository_index(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def work() -> Any:
            entries = await self.calls.plane.models.index(request.ready)
            response = message("inference.RepositoryIndexResponse")()
            for entry in entries:
                response.models.add(**entry)
            return response

        return await self._run(context, "management", work)

    async def repository_model_load(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def work() -> Any:
            models = self.calls.plane.models
            models.control()
            parameters = parameters_json(request.parameters)
            if "config" in parameters and not isinstance(parameters["config"], str):
                raise BadRequest("parameters.config must be a string holding a JSON object")
            await models.load(request.model_name, parameters)
            return message("inference.RepositoryModelLoadResponse")()

        return await self._run(context, "management", work)

    async def repository_model_unload(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def work() -> Any:
            models = self.calls.plane.models
            models.control()
            await models.unload(request.model_name, parameters_json(request.parameters))
            return message("inference.RepositoryModelUnloadResponse")()

        return await self._run(context, "management", work)
