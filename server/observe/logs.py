"""Logging for ``torchbay serve``: the access log, the JSON formatter, and the root setup.

Access log: one INFO line per inference request on the ``torchbay.access`` logger::

    127.0.0.1:53412 "POST /predictions/resnet HTTP/1.1" 200 model=resnet version=1.0
        total_ms=3.214 queue_ms=0.41      (one line)

``queue_ms`` is ``None`` when no worker took the request (rejected at admission, unknown model).
The path, model and version come from the client (percent-decoded): a character that is not
printable (a line break, an ANSI escape) is written escaped (``\\n``, :func:`printable`), so a
client cannot end the line or start a forged one, and is cut at ``MAX_FIELD`` characters.
The line costs one ``isEnabledFor`` check when the logger is off, and is formatted lazily.

``--log-format json`` makes every record one JSON object per line: ``time`` (ISO 8601, UTC),
``level``, ``logger``, ``message``, ``process``, the access fields (``client``, ``method``,
``path``, ``http_version``, ``status``, ``model``, ``version``, ``total_ms``, ``queue_ms``) on
access records, ``exc_info`` when there is a traceback, and any ``extra=`` attributes.

:func:`configure_logging` writes through a queue and a listener thread, so a slow stderr reader
(a pipe to a log shipper) never blocks the event loop: records are formatted on the caller's
thread and only the write moves. Torch-free.
"""

from __future__ import annotations

import asyncio
import json
import logging
import logging.handlers
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from torchbay.server.observe.logwriter import (
    BARRIER,
    FastAccess,
    IdleFlushFile,
    IdleFlushHandler,
    Listener,
    OwnedQueueHandler,
    RecordFilter,
    Records,
    close_quietly,
    flush_quietly,
    printable,
    stderr_stream,
)
from torchbay.server.observe.rollover import Rotation

if TYPE_CHECKING:
    from torchbay.server.serving.model import ModelVersion

ACCESS_LOGGER = "torchbay.access"
ACCESS_FIELDS = (
    "client",
    "method",
    "path",
    "http_version",
    "status",
    "model",
    "version",
    "total_ms",
    "queue_ms",
)
MAX_FIELD = 1024  # characters kept of a client's path, model, version (gRPC's: megabytes)
_ACCESS_FORMAT = '%s "%s %s HTTP/%s" %d model=%s version=%s total_ms=%.3f queue_ms=%s'
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

access_log = logging.getLogger(ACCESS_LOGGER)

Scope = MutableMapping[str, Any]  # an ASGI scope, as http.asgi.Scope (observe imports no http)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One answered inference request, as every listener reports it (metrics, access log)."""

    scope: Scope
    name: str  # the model name the client asked for
    version: str | None  # the version it asked for (None: the default)
    status: int
    seconds: float  # from the request's arrival to its answer
    queue_s: float | None  # None when no worker took it
    model: ModelVersion | None  # None when it was not routed to a model
    inferences: int = 1  # Triton's inference_count of it (plane/triton_config.py, inferences)


# Called once per answered request: the listeners' on_request, ServerMetrics.request_done.
RequestHook = Callable[[RequestRecord], None]


def request_hook(record: RequestHook | None) -> RequestHook:
    """The listeners' ``on_request``: ``record`` (metrics) per request, then the access lines of
    every request answered in one turn of the event loop, queued together (:class:`Deferred`)."""
    enabled = access_log.isEnabledFor
    answered: list[RequestRecord] = []

    def on_request(request: RequestRecord) -> None:
        if record is not None:
            record(request)
        if enabled(logging.INFO):
            answered.append(request)

    def write_lines() -> None:
        if answered:
            requests = answered[:]
            answered.clear()
            log_access_all(requests)

    return Deferred(on_request, write_lines)


class Deferred:
    """A RequestHook run over several requests at once. A call keeps its record; the first of a
    run asks the event loop to run the hook over all of them (``call_soon``: after the tasks
    ready now and before the callbacks of the next socket reads, so a metrics scrape or a
    request that follows an answer sees it counted). The answer has been sent by then either
    way. Done in one tight loop per turn, a request's bookkeeping (metrics, statistics, access
    line) cost the frontend about 12 us less than done inline between answers (tiny c=16:
    89 -> 78 us/request, benchmarks/RESULTS.md). Outside an event loop it runs at once."""

    __slots__ = ("_after", "_hook", "_pending")

    def __init__(self, hook: RequestHook, after: Callable[[], None] | None = None) -> None:
        self._hook = hook
        self._after = after  # once per run, after the hook saw each of its records
        self._pending: list[RequestRecord] = []

    def __call__(self, request: RequestRecord) -> None:
        pending = self._pending
        pending.append(request)
        if len(pending) > 1:
            return  # the run's drain is scheduled
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.drain()
            return
        loop.call_soon(self.drain)

    def drain(self) -> None:
        """Run the hook over every kept record (each once; one that raises is logged), then
        ``after``."""
        pending, self._pending = self._pending, []
        for request in pending:
            try:
                self._hook(request)
            except Exception:
                _record_failed(request)
        if self._after is not None:
            try:
                self._after()
            except Exception:
                logging.getLogger("torchbay.serve").exception("writing access lines failed")


def _record_failed(request: RequestRecord) -> None:
    logging.getLogger("torchbay.serve").exception(
        "recording request %s %s failed", request.name, request.status
    )


def _access_args(request: RequestRecord) -> tuple[Any, ...]:
    """The values of one access line, in ``ACCESS_FIELDS`` order; what the client sent through
    :func:`printable`."""
    scope, mv, queue_s = request.scope, request.model, request.queue_s
    client = scope.get("client")
    version = mv.version if mv is not None else request.version
    return (
        f"{client[0]}:{client[1]}" if client else "-",
        scope["method"],
        printable(scope["path"], MAX_FIELD),
        scope.get("http_version", "1.1"),
        request.status,
        printable(request.name, MAX_FIELD),
        version if version is None else printable(version, MAX_FIELD),
        request.seconds * 1000,
        None if queue_s is None else round(queue_s * 1000, 3),
    )


def log_access(request: RequestRecord) -> None:
    """Write one access line for a finished request (see the module docstring)."""
    log_access_all([request])


def log_access_all(requests: list[RequestRecord]) -> None:
    """Access lines for ``requests``, in order. On the text pipeline's fast path they are queued
    as one item with one time stamp (they were answered in the same event-loop turn): one queue
    put and one clock read per turn instead of per request. A request whose line cannot be
    built is logged as a failure; the others still get theirs."""
    fast = _fast_access
    if fast is None or not fast.applies():
        for request in requests:
            try:
                access_log.info(_ACCESS_FORMAT, *_access_args(request))
            except Exception:
                _record_failed(request)
        return
    messages = []
    for request in requests:
        try:
            messages.append(_ACCESS_FORMAT % _access_args(request))
        except Exception:
            _record_failed(request)
    if messages:
        fast.put_all(messages)


_fast_access: FastAccess | None = None  # set by configure_logging for the text format


_PID = os.getpid()

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, one line (see the module docstring for the keys)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process or _PID,
        }
        args = record.args
        if (
            record.name == ACCESS_LOGGER
            and isinstance(args, tuple)
            and len(args) == len(ACCESS_FIELDS)
        ):
            out.update(zip(ACCESS_FIELDS, args, strict=True))
            out["total_ms"] = round(out["total_ms"], 3)
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc_info"] = record.exc_text
        if record.stack_info:
            out["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """``TEXT_FORMAT``, formatting the timestamp's seconds once per second, not per record."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)
        self._second = -1
        self._stamp = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return f"{self.stamp(record.created)},{int(record.msecs):03d}"

    def stamp(self, created: float) -> str:
        """The local date and time to the second of ``created`` (cached per second)."""
        second = int(created)
        if second != self._second:
            self._second, self._stamp = (
                second,
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second)),
            )
        return self._stamp


def make_formatter(log_format: str) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else TextFormatter()


class LogPipeline:
    """What :func:`configure_logging` set up. Call it once at exit: it flushes what is queued and
    puts logging's global switches back."""

    def __init__(self, records: queue.SimpleQueue, formatter: logging.Formatter) -> None:
        self._records = records
        self.formatter = formatter  # the frontend's: text or JSON
        self._stop: Callable[[], None] = lambda: None

    def __call__(self) -> None:
        self._stop()

    def backlog(self) -> int:
        """Records queued and not written yet (many: a console that nobody reads)."""
        return self._records.qsize()

    def put_line(self, name: str, line: str) -> None:
        """Write ``line`` as it is (already formatted) to every destination, as logger ``name``."""
        record = logging.LogRecord(name, logging.INFO, "", 0, line, None, None)
        self._records.put(record)

    def put_message(self, name: str, message: str) -> None:
        """Format ``message`` as a record of logger ``name`` (INFO) and write it."""
        record = logging.LogRecord(name, logging.INFO, "", 0, message, None, None)
        self.put_line(name, self.formatter.format(record))

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything logged so far is written and flushed (False: not in time)."""
        record = logging.LogRecord(BARRIER, logging.INFO, "", 0, "", None, None)
        done = threading.Event()
        record.barrier = done
        self._records.put(record)
        return done.wait(timeout)


def _quiet_uvicorn(record: logging.LogRecord) -> bool:
    """Each uvicorn server logs "Shutting down" (three listeners: three lines); ours logs one."""
    return not (
        record.name == "uvicorn.error"
        and isinstance(record.msg, str)
        and record.msg.startswith(("Shutting down", "Waiting for connections to close"))
    )


def configure_logging(
    log_format: str = "text",
    *,
    level: int | None = None,
    stream: TextIO | None = None,
    access_log: bool = True,
    files: Mapping[Path, RecordFilter | None] | None = None,
    rotation: Rotation = Rotation(),
) -> LogPipeline:
    """Route every log record (ours, uvicorn's) through one formatter to ``stream`` (stderr) and
    to each of ``files`` (appended to, rolled over as ``rotation`` says; a filter keeps only
    some records, see ``logfiles.py``).

    Replaces the root logger's handlers; ``level`` None keeps the root level; ``access_log``
    False silences the ``torchbay.access`` logger. Returns the :class:`LogPipeline`: call it once
    at exit (it flushes what is queued and restores nothing else).
    """
    # No caller lookup per record (file, line, function): none of our formats prints it, and it
    # walks the stack on every call (logging's documented optimisation).
    srcfile = logging._srcfile  # type: ignore[attr-defined]
    logging._srcfile = None  # type: ignore[attr-defined]
    # Nor thread and process names: no format of ours shows them (JSON gets the pid anyway).
    saved_flags = (logging.logThreads, logging.logProcesses, logging.logMultiprocessing)
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging.getLogger(ACCESS_LOGGER).setLevel(logging.INFO if access_log else logging.WARNING)
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addFilter(_quiet_uvicorn)
    root = logging.getLogger()
    records = Records()
    front = OwnedQueueHandler(records)
    pipeline = LogPipeline(records, make_formatter(log_format))
    front.setFormatter(pipeline.formatter)  # format here; the listener only writes
    file_writers = [IdleFlushFile(p, records, keep, rotation) for p, keep in (files or {}).items()]
    writers = [IdleFlushHandler(stream or stderr_stream(), records), *file_writers]
    listener = Listener(records, *writers, formatter=pipeline.formatter)  # writers: %(message)s
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(front)
    if level is not None:
        root.setLevel(level)
    listener.start()
    global _fast_access
    if isinstance(formatter := pipeline.formatter, TextFormatter):
        _fast_access = FastAccess(logging.getLogger(ACCESS_LOGGER), front, formatter.stamp, records)

    def stop() -> None:
        global _fast_access
        _fast_access = None
        listener.stop()
        root.removeHandler(front)
        uvicorn_log.removeFilter(_quiet_uvicorn)
        for writer in writers:
            flush_quietly(writer)
        for writer in file_writers:
            close_quietly(writer)
        logging._srcfile = srcfile  # type: ignore[attr-defined]
        logging.logThreads, logging.logProcesses, logging.logMultiprocessing = saved_flags

    pipeline._stop = stop
    return pipeline
