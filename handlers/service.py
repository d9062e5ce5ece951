"""The Service: the one entry point the worker process and ``torchbay verify`` call.

``load_service(model_dir, ...)`` reads the manifest, installs the ``ts`` alias, resolves and
initializes the handler. ``Service.predict(requests)`` turns a batch of raw requests into
TorchServe's input rows, runs the handler and returns exactly one ``Response`` per request; it
never raises for a handler fault:

* a body that cannot be decoded (bad JSON, malformed v2) -> 400 for that request only;
* an exception escaping the handler -> every request of the batch answers 500 (a
  ``PredictionException`` answers its ``error_code``), body ``{"code", "type", "message"}``;
* a result that is not a list of ``len(batch)`` items -> 500 "number of batch response mismatched";
* statuses/headers set through ``context.set_response_status`` etc. apply per request.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Any, Protocol

from . import envelopes
from .context import Context
from .errors import HandlerError, HandlerLoadError, PredictionException
from .metrics import MetricsCache

logger = logging.getLogger(__name__)


class RequestLike(Protocol):
    request_id: str
    body: bytes
    content_type: str
    headers: dict[str, str]  # lower-case names
    query: str  # raw query string
    protocol: str  # "predict" | "v2"


@dataclass
class Request:
    request_id: str
    body: bytes = b""
    content_type: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    query: str = ""
    protocol: str = "predict"


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class BatchOutcome:
    responses: list[Response]
    timings: dict[str, float]
    metrics: list[dict[str, Any]]


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), default=_json_default).encode()


def _json_default(value: Any) -> Any:
    # numpy scalars/arrays and tensors, without importing either here.
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def error_response(status: int, kind: str, message: str, v2: bool = False) -> Response:
    body: dict[str, Any] = {"code": status, "type": kind, "message": message}
    if v2:
        body["error"] = message  # the OIP error field
    return Response(status, _dumps(body))


class Service:
    """A loaded handler bound to its Context; ``predict`` serves one batch at a time."""

    def __init__(
        self,
        context: Context,
        resolved: Any,
        device: str,
        model_name: str,
        model_version: str,
    ) -> None:
        self.context = context
        self.handler = resolved.instance
        self._entry = resolved.entry
        self.device = device
        self.model_name = model_name
        self.model_version = model_version
        self.native_v2 = bool(getattr(self.handler, "supports_v2", False))

    def predict(self, requests: Sequence[RequestLike]) -> BatchOutcome:
        """One Response per request, in order (see the module docstring for the error rules)."""
        n = len(requests)
        responses: list[Response | None] = [None] * n
        rows: list[dict[str, Any]] = []
        v2_requests: dict[int, dict[str, Any]] = {}
        kept: list[int] = []
        for i, request in enumerate(requests):
            try:
                rows.append(self._row(request, i, v2_requests))
                kept.append(i)
            except PredictionException as exc:
                responses[i] = error_response(
                    exc.error_code, type(exc).__name__, exc.message, request.protocol == "v2"
                )
        timings: dict[str, float] = {}
        if kept:
            batch = [requests[i] for i in kept]
            outs = self._run(batch, rows, [v2_requests.get(i) for i in kept], timings)
            for i, response in zip(kept, outs, strict=True):
                responses[i] = response
        metrics = self.context.metrics.drain() if self.context.metrics is not None else []
        return BatchOutcome([r for r in responses if r is not None], timings, metrics)

    def _row(self, request: RequestLike, i: int, v2_requests: dict[int, Any]) -> dict[str, Any]:
        if request.protocol == "v2":
            oip = envelopes.parse_v2_request(request.body)
            v2_requests[i] = oip
            if self.native_v2:
                return {"body": oip, "protocol": "v2"}
            body = envelopes.v2_body(oip)
            return {"body": body, "data": body}
        return envelopes.decode_request(request.body, request.content_type, request.query)

    def _run(
        self,
        batch: list[RequestLike],
        rows: list[dict[str, Any]],
        v2: list[dict[str, Any] | None],
        timings: dict[str, float],
    ) -> list[Response]:
        self.context.reset_batch([r.request_id for r in batch], [dict(r.headers) for r in batch])
        start = perf_counter()
        try:
            results = self._entry(rows, self.context)
        except Exception as exc:  # any handler fault answers the batch, never the worker
            timings["handler"] = (perf_counter() - start) * 1000
            logger.error("handler failed on a batch of %d", len(batch), exc_info=True)
            status = exc.error_code if isinstance(exc, PredictionException) else 500
            message = exc.message if isinstance(exc, PredictionException) else str(exc)
            return [error_response(status, type(exc).__name__, message, v is not None) for v in v2]
        timings["handler"] = (perf_counter() - start) * 1000
        timings.update(getattr(self.context, "stage_timings", {}) or {})
        if not isinstance(results, list) or len(results) != len(batch):
            got = len(results) if isinstance(results, list) else type(results).__name__
            logger.error("handler returned %s results for a batch of %d", got, len(batch))
            return [
                error_response(
                    500,
                    "InternalServerException",
                    "number of batch response mismatched",
                    v is not None,
                )
                for v in v2
            ]
        return [self._encode(i, item, v2[i]) for i, item in enumerate(results)]

    def _encode(self, idx: int, item: Any, v2: dict[str, Any] | None) -> Response:
        status, phrase = self.context.get_response_status(idx)
        headers = dict(self.context.get_response_headers(idx))
        content_type = headers.pop("content-type", None) or headers.pop("Content-Type", None)
        if status >= 400 and item is None:
            return error_response(status, "PredictionException", phrase or "", v2 is not None)
        if v2 is not None and status < 400:
            outputs = item if self.native_v2 else envelopes.wrap_result(item, v2)
            if self.native_v2 and isinstance(item, dict) and "outputs" in item:
                outputs = item["outputs"]
            body = envelopes.v2_response(outputs, v2, self.model_name, self.model_version)
            return Response(status, _dumps(body), "application/json", headers)
        if v2 is not None and isinstance(item, dict) and "message" in item:
            item = {**item, "error": item["message"]}
        try:
            if isinstance(item, (bytes, bytearray, memoryview)):
                return Response(
                    status, bytes(item), content_type or "application/octet-stream", headers
                )
            if isinstance(item, str):
                return Response(
                    status, item.encode(), content_type or "text/plain; charset=utf-8", headers
                )
            return Response(status, _dumps(item), content_type or "application/json", headers)
        except (TypeError, ValueError) as exc:
            logger.error("cannot encode the handler's result %d", idx, exc_info=True)
            return error_response(500, type(exc).__name__, f"cannot encode result: {exc}")


def _model_yaml_config(model_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    config_file = manifest.get("model", {}).get("configFile")
    if not config_file:
        return {}
    from .loading import inside  # the configFile must stay inside the model folder

    path = inside(model_dir, str(config_file), "configFile")
    if not path.is_file():
        raise HandlerLoadError(f"config file {config_file!r} not found in the archive")
    import yaml

    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise HandlerLoadError(f"cannot read config file {config_file!r}: {exc}") from exc
    if not isinstance(config, dict):
        raise HandlerLoadError(f"config file {config_file!r} is not a mapping")
    return config


def load_service(
    model_dir: str | os.PathLike,
    *,
    handler: str | None = None,
    batch_size: int = 1,
    gpu_id: int | None = None,
    server_version: str = "",
    limit_max_image_pixels: bool = True,
    model_name: str | None = None,
    model_version: str | None = None,
) -> Service:
    """Load the model directory's handler and model; raises HandlerLoadError on any failure."""
    from .loading import read_manifest
    from .resolve import install_ts_alias, resolve_handler

    model_dir = Path(model_dir).resolve()
    if not model_dir.is_dir():
        raise HandlerLoadError(f"model directory {model_dir} does not exist")
    manifest = read_manifest(model_dir)
    model = manifest["model"]
    name = model_name or str(model.get("modelName") or model_dir.name)
    version = model_version or str(model.get("modelVersion") or "")
    yaml_config = _model_yaml_config(model_dir, manifest)
    install_ts_alias()
    # TorchServe puts the model directory on sys.path so handlers import their sibling files.
    if str(model_dir) not in sys.path:
        sys.path.insert(0, str(model_dir))
    context = Context(
        name,
        str(model_dir),
        manifest,
        batch_size,
        gpu_id,
        server_version,
        limit_max_image_pixels,
        MetricsCache(name),
        yaml_config,
    )
    spec = handler or model.get("handler") or ""
    try:
        resolved = resolve_handler(str(spec), model_dir)
        if resolved.is_function:
            resolved.entry(None, context)
        else:
            resolved.instance.initialize(context)
    except HandlerLoadError:
        raise
    except HandlerError as exc:
        raise HandlerLoadError(f"handler {spec!r} failed to initialize: {exc}") from exc
    except Exception as exc:
        logger.error("handler %r failed to initialize", spec, exc_info=True)
        raise HandlerLoadError(f"handler {spec!r} failed to initialize: {exc!r}") from exc
    device = _device_of(resolved.instance, gpu_id)
    context.metrics.drain()  # metrics recorded while loading are not a batch's
    return Service(context, resolved, device, name, version)


def _device_of(instance: Any, gpu_id: int | None) -> str:
    device = getattr(instance, "device", None)
    if device is not None:
        return str(device)
    return "cpu" if gpu_id is None else f"cuda:{gpu_id}"
