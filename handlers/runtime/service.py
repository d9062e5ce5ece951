"""The Service: the one entry point the worker process and ``torchbay verify`` call.

``load_service(model_dir, ...)`` reads the manifest, installs the ``ts`` alias, resolves and
initializes the handler. ``Service.predict(requests)`` turns a batch of raw requests into
TorchServe's input rows, runs the handler and returns exactly one ``Response`` per request. It
never raises for anything a request carries, and one request never fails another.

Isolation:

* decoding happens per request; a request that cannot be decoded is answered alone;
* requests whose ``explain`` or ``describe`` headers differ run as batches of their own
  (modes.py): handlers read those headers from a batch's first request;
* when ``handle()`` raises on a batch of n > 1 requests (any exception), or returns a wrong number
  of results, the batch is run again in halves, recursively, so the failure is pinned on the
  request(s) that cause it and every other request gets its answer (per-item failures through
  ``BaseHandler.map_items`` stay as they are).
  Stage timings are summed over all the runs of one batch. A run that streamed parts (or was
  cancelled) is never run again: see streaming.py, whose parts go out through ``part_sink``.

Status classes, decided by exception type and where it was raised, never by message text:

* 400: the body cannot be decoded or is invalid (bad JSON, JSON nested deeper than
  ``envelopes.MAX_JSON_DEPTH``, malformed v2 or multipart, bad text encoding, an OIP request
  that does not fit the model's signature: ``handlers/oip.py``), or ``BadInput``;
  a ``Content-Encoding`` body is inflated first (``oip_encoding``: 415 unknown coding, 413 past
  ``max_request_size``);
* 413: a size limit is the cause: decoding ran out of memory (the built-in ``tensor`` handler
  also answers 413 when loading an .npy, or the model on an input alone, runs out of memory);
* 422: a well-formed input the model cannot process: ``UnprocessableInput``, which the built-in
  handlers raise when the model raises on an input alone (after bisecting isolated it), and the
  ``tensor`` handler when the input's shape does not match the manifest's ``input_shape`` or its
  v2 datatype has no tensor type;
* a ``PredictionException`` from the handler on a request alone answers its ``error_code``
  (400..599, else 500);
* 500: a handler bug: any other exception on a request alone, a wrong number of results, a
  result that cannot be encoded, or an invalid status/header set through the context.

Error bodies are ``{"code", "type", "message"}`` (v2 adds ``"error"``). A message from an
exception other than ``PredictionException`` is never shown: the body names the exception type
and the request id, the worker log keeps the traceback tagged with the request id.
``PredictionException`` messages pass through ``errors.scrub_message`` (no traceback, no path).

Statuses and headers set through ``context.set_response_status`` etc. apply per request and are
validated: the status an int 100..599 (not bool), header names RFC 7230 tokens, values latin-1
without CR, LF or NUL; framing headers (Content-Length, Transfer-Encoding, Connection) are
dropped with a warning.

Every JSON body is valid JSON: NaN and +-Infinity are written as ``null`` (as KServe's server via
orjson and JavaScript's JSON.stringify do), in v2 outputs and TorchServe predict outputs alike.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Any, Protocol

from .. import oip_signature
from ..context import Context
from ..errors import (
    HandlerLoadError,
    PredictionException,
    failure_message,
    handler_fault,
)
from ..metrics import MetricsCache
from ..streaming import StreamCancelled
from . import continuous, controls, envelopes, modes, oip
from .oip_encoding import DEFAULT_MAX_SIZE, decode_content
from .responses import Response, decode_failure, error_response, prediction_error
from .results import ResultEncoder
from .streams import NullSink, PartSink, RunStream, cancelled_response, drive_generators, streams

__all__ = ["BatchOutcome", "Request", "Response", "Service", "error_response", "load_service"]

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
class BatchOutcome:
    responses: list[Response]
    timings: dict[str, float]
    metrics: list[dict[str, Any]]
    handled: int | None = None  # the requests the handler ran (not refused before it)


@dataclass
class _Job:
    """One decoded request on its way through the handler."""

    request: RequestLike
    row: Any
    v2: dict[str, Any] | None
    types: dict[str, str] = field(default_factory=dict)  # each row key's content type

    def headers(self) -> dict[str, Any]:
        """What the handler's context gives as this request's headers: as TorchServe 0.12,
        each input parameter's content type under its name (``{"content-type": ...}``), then
        the request's headers (a header named as a parameter wins, as there)."""
        types = {name: {"content-type": ctype} for name, ctype in self.types.items()}
        return {**types, **self.request.headers}


class _CountMismatch(Exception):
    """The handler returned a non-list or a list of the wrong length (bisected like a raise)."""


def _add(timings: dict[str, float], stage: str, ms: float) -> None:
    timings[stage] = timings.get(stage, 0.0) + ms


class Service(ResultEncoder):
    """A loaded handler bound to its Context; ``predict`` serves one batch at a time."""

    def __init__(
        self,
        context: Context,
        resolved: Any,
        device: str,
        model_name: str,
        model_version: str,
        signature: Any = None,
        max_request_size: int = DEFAULT_MAX_SIZE,
        decode_input: bool = True,  # TorchServe's decode_input_request: JSON and text decoded
    ) -> None:
        self.decode_input = decode_input
        self.load_metrics: list[dict[str, Any]] = []  # recorded by the handler's initialize
        self.context = context
        self.handler = resolved.instance
        self._entry = resolved.entry
        self.device = device
        self.model_name = model_name
        self.model_version = model_version
        self.native_v2 = bool(getattr(self.handler, "supports_v2", False))
        self.part_sink: PartSink = NullSink()  # the worker's socket: streamed parts (streaming.py)
        self.signature = signature  # archiver.signature.Signature | None
        self.controls = controls.declared(context.model_yaml_config)  # Triton's, for sequences
        self.max_request_size = max_request_size

    def predict(self, requests: Sequence[RequestLike]) -> BatchOutcome:
        """One Response per request, in order (see the module docstring for the error rules)."""
        responses: list[Response | None] = [None] * len(requests)
        jobs: list[_Job] = []
        kept: list[int] = []
        for i, request in enumerate(requests):
            try:
                jobs.append(self._decode(request))
                kept.append(i)
            except Exception as exc:  # whatever decoding raises answers this request alone
                responses[i] = decode_failure(exc, request.request_id, request.protocol == "v2")
        timings: dict[str, float] = {}
        if jobs:  # explanations and predictions gathered together run apart (modes.py)
            answers = modes.by_mode(jobs, lambda group: self._run_isolated(group, timings))
            for i, response in zip(kept, answers, strict=True):
                responses[i] = response
        metrics = self.context.metrics.drain() if self.context.metrics is not None else []
        return BatchOutcome([r for r in responses if r is not None], timings, metrics, len(jobs))

    def _decode(self, request: RequestLike) -> _Job:
        if continuous.continued(request):  # its body was in an earlier call
            return _Job(request, {}, None)
        if request.protocol == "v2":
            given = (self.max_request_size, getattr(request, "regions", None), self.model_name)
            v2 = oip.parse_request(request.body, request.headers, *given)
            controls.fill(v2, request.headers, self.controls, self.context)  # START, READY...
            bound = getattr(request, "max_batch", 0)  # Triton's max_batch_size, when declared
            oip.check_signature(v2, self.signature, bound, self.model_name)
            types = {"body": envelopes.mime_type(request.content_type)}
            if self.native_v2:
                return _Job(request, {"body": v2, "protocol": "v2"}, v2, types)
            body = oip.body_value(v2)
            return _Job(request, {"body": body, "data": body}, v2, types)
        encoding = request.headers.get("content-encoding")
        raw = decode_content(request.body, encoding, self.max_request_size)
        types: dict[str, str] = {}
        row = envelopes.decode_request(
            raw, request.content_type, request.query, self.decode_input, types
        )
        return _Job(request, row, None, types)

    def _run_isolated(self, jobs: list[_Job], timings: dict[str, float]) -> list[Response]:
        """Run ``jobs``; if the handler raises, run each half again until the culprit is alone."""
        metrics = self.context.metrics
        mark = metrics.mark() if metrics is not None else 0
        outcome = self._run(jobs, timings)
        if not isinstance(outcome, BaseException):
            return outcome
        ids = [job.request.request_id for job in jobs]
        stream = self.context.stream
        if len(jobs) == 1 or isinstance(outcome, StreamCancelled) or (stream and stream.sent):
            # never re-run a handler that streamed parts (see streaming.py)
            return [self._handler_failure(outcome, job) for job in jobs]
        if metrics is not None:  # the metrics this run recorded: its halves record them again
            metrics.rewind(mark)
        logger.warning(
            "handler raised %s on a batch of %d (request ids %s); retrying in halves",
            type(outcome).__name__,
            len(jobs),
            ", ".join(ids),
        )
        mid = len(jobs) // 2
        return self._run_isolated(jobs[:mid], timings) + self._run_isolated(jobs[mid:], timings)

    def _handler_failure(self, exc: BaseException, job: _Job) -> Response:
        rid = job.request.request_id
        v2 = job.v2 is not None
        if isinstance(exc, StreamCancelled):
            return cancelled_response(rid, v2)
        if isinstance(exc, _CountMismatch):
            logger.error("request %s: %s", rid, exc)
            message = "number of batch response mismatched"
            return error_response(500, "InternalServerException", message, v2)
        if isinstance(exc, PredictionException):
            logger.info("request %s: %s: %s", rid, type(exc).__name__, exc.message)
            return prediction_error(exc, v2)
        logger.error("handler failed on request %s", rid, exc_info=exc)
        return error_response(500, type(exc).__name__, failure_message(exc, [rid]), v2)

    def _run(self, jobs: list[_Job], timings: dict[str, float]) -> list[Response] | BaseException:
        """The responses of one handler run over ``jobs``, or the exception it raised."""
        requests = [job.request for job in jobs]
        self.context.reset_batch([r.request_id for r in requests], [j.headers() for j in jobs])
        # A shallow copy per run: a handler that edits its rows must not spoil a retry.
        rows = [dict(job.row) if isinstance(job.row, dict) else job.row for job in jobs]
        stream = RunStream(
            self.part_sink,
            [r.request_id for r in requests],
            lambda idx, item: self._encode(idx, item, jobs[idx]),
        )
        self.context.stream = stream
        finals: dict[int, Response] = {}  # generators' final responses (streaming.py)
        start = perf_counter()
        try:
            results = self._entry(rows, self.context)
            if streams(results, len(jobs)):
                fail = lambda idx, exc: self._handler_failure(exc, jobs[idx])  # noqa: E731
                finals = drive_generators(results, stream, fail, [j.v2 is not None for j in jobs])
            elif isinstance(results, list) and len(results) == len(jobs):
                continuous.mark_stream_next(self.context, results)  # continuousBatching's
        except BaseException as exc:  # a handler bug (sys.exit() too): bisected by the caller
            if not handler_fault(exc):
                raise
            return exc
        finally:
            stream.end()
            _add(timings, "handler", (perf_counter() - start) * 1000)
            for stage, ms in (getattr(self.context, "stage_timings", None) or {}).items():
                _add(timings, stage, ms)
        if not isinstance(results, list) or len(results) != len(jobs):
            got = len(results) if isinstance(results, list) else type(results).__name__
            return _CountMismatch(f"handler returned {got} results for a batch of {len(jobs)}")
        pairs = enumerate(zip(results, jobs, strict=True))
        return [finals.get(i) or self._encode(i, item, job) for i, (item, job) in pairs]


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
    max_request_size: int = DEFAULT_MAX_SIZE,
    decode_input_request: bool = True,
    model_metrics: Sequence[Sequence[Any]] | None = None,
    sequence_headers: Sequence[str] | None = None,  # the server's names: id, start, end
    blacklist_env_vars: str = "",  # TorchServe's: variables the handler must not see
) -> Service:
    """Load the model directory's handler and model; raises HandlerLoadError on any failure."""
    from .loading import hide_environment, model_yaml_config, read_manifest
    from .resolve import device_of, install_ts_alias, start_handler

    model_dir = Path(model_dir).resolve()
    if not model_dir.is_dir():
        raise HandlerLoadError(f"model directory {model_dir} does not exist")
    manifest = read_manifest(model_dir)
    model = manifest["model"]
    name = model_name or str(model.get("modelName") or model_dir.name)
    version = model_version or str(model.get("modelVersion") or "")
    yaml_config = model_yaml_config(model_dir, manifest)
    install_ts_alias()
    hide_environment(blacklist_env_vars)
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
        MetricsCache(name, model_metrics),
        yaml_config,
    )
    if sequence_headers:  # before the handler's initialize, which may read them
        keys = ("id", "start", "end")
        for key, header in zip(keys, sequence_headers, strict=True):
            setattr(context, f"header_key_sequence_{key}", header)
    spec = str(handler or model.get("handler") or "")
    # An absolute file only from the Load (the server's default_service_handler).
    resolved = start_handler(spec, model_dir, context, outside_ok=handler is not None)
    device = device_of(resolved.instance, gpu_id)
    signature = oip_signature.for_requests(manifest, yaml_config, resolved.instance)
    load_metrics = context.metrics.drain()  # the worker's Ready carries them, not a batch
    service = Service(
        context, resolved, device, name, version, signature, max_request_size, decode_input_request
    )
    service.load_metrics = load_metrics
    return service
