"""The access log and ``--log-format json``."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from torchbay.server.observe.logs import (
    ACCESS_FIELDS,
    ACCESS_LOGGER,
    Deferred,
    JsonFormatter,
    RequestRecord,
    configure_logging,
    log_access,
    request_hook,
)

from .conftest import probe_models
from .log_helpers import SCOPE, kept_root_logging


@pytest.fixture
def root_logging() -> Iterator[logging.Logger]:
    with kept_root_logging() as root:
        yield root


def _record(name: str, msg: str, args: Any, **kwargs: Any) -> logging.LogRecord:
    return logging.getLogger(name).makeRecord(
        name, logging.INFO, __file__, 1, msg, args, kwargs.pop("exc_info", None), extra=kwargs
    )


def test_json_formatter_one_object_per_line() -> None:
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        import sys

        exc_info = sys.exc_info()
    record = _record("torchbay.x", "loaded %s in %d ms", ("m", 12), exc_info=exc_info, model="m")
    line = JsonFormatter().format(record)
    assert "\n" not in line
    data = json.loads(line)
    assert data["message"] == "loaded m in 12 ms"
    assert data["level"] == "INFO" and data["logger"] == "torchbay.x"
    assert data["model"] == "m"  # extra= attributes are kept
    assert "ValueError: boom" in data["exc_info"]
    assert data["time"].endswith("+00:00")


def test_access_line_text_and_json(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    log_access(RequestRecord(SCOPE, "m", None, 200, 0.0123, 0.0004, None))
    log_access(RequestRecord(SCOPE, "nope", "2.0", 404, 0.001, None, None))
    ok, missing = caplog.records
    assert ok.getMessage() == (
        '127.0.0.1:5000 "POST /predictions/m HTTP/1.1" 200 model=m version=None '
        "total_ms=12.300 queue_ms=0.4"
    )
    assert "version=2.0" in missing.getMessage() and "queue_ms=None" in missing.getMessage()
    data = json.loads(JsonFormatter().format(ok))
    assert {k: data[k] for k in ACCESS_FIELDS} == {
        "client": "127.0.0.1:5000",
        "method": "POST",
        "path": "/predictions/m",
        "http_version": "1.1",
        "status": 200,
        "model": "m",
        "version": None,
        "total_ms": 12.3,
        "queue_ms": 0.4,
    }


def test_access_log_off_costs_no_formatting() -> None:
    access = logging.getLogger(ACCESS_LOGGER)
    seen: list[RequestRecord] = []
    hook = request_hook(seen.append)
    old = access.level
    access.setLevel(logging.WARNING)
    try:
        # A scope without "method" would raise if the line were built.
        request = RequestRecord({"path": "/x"}, "m", None, 200, 0.01, None, None)
        hook(request)
    finally:
        access.setLevel(old)
    assert seen == [request]


def test_deferred_hook_runs_once_per_loop_turn_in_order_and_survives_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Records of one event-loop turn are kept, then run together, in order, before the next
    turn's callbacks; a record whose hook raises is logged and the others still run."""
    seen: list[str] = []

    def hook(request: RequestRecord) -> None:
        if request.name == "bad":
            raise ValueError("boom")
        seen.append(request.name)

    deferred = Deferred(hook)

    def record(name: str) -> RequestRecord:
        return RequestRecord(SCOPE, name, None, 200, 0.001, None, None)

    async def main() -> list[list[str]]:
        snapshots = []
        for name in ("a", "bad", "b"):
            deferred(record(name))
        snapshots.append(list(seen))  # nothing ran yet: same turn
        await asyncio.sleep(0)  # one turn: the drain scheduled before us has run
        snapshots.append(list(seen))
        deferred(record("c"))
        snapshots.append(list(seen))
        await asyncio.sleep(0)
        snapshots.append(list(seen))
        return snapshots

    with caplog.at_level(logging.ERROR, logger="torchbay.serve"):
        snapshots = asyncio.run(main())
    assert snapshots == [[], ["a", "b"], ["a", "b"], ["a", "b", "c"]]
    assert "recording request bad 200 failed" in caplog.text
    deferred(record("d"))  # no running loop: at once
    assert seen[-1] == "d"


def test_configure_logging_json_routes_every_logger(root_logging: logging.Logger) -> None:
    stream = io.StringIO()
    stop = configure_logging("json", level=logging.INFO, stream=stream)
    try:
        logging.getLogger("uvicorn.error").info("listening on %s", "127.0.0.1")
        logging.getLogger("torchbay.serve").warning("careful")
        log_access(RequestRecord(SCOPE, "m", "1.0", 503, 0.002, None, None))
    finally:
        stop()
    lines = stream.getvalue().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["logger"] for r in records] == ["uvicorn.error", "torchbay.serve", ACCESS_LOGGER]
    assert records[0]["message"] == "listening on 127.0.0.1"
    assert records[2]["status"] == 503 and records[2]["version"] == "1.0"


def test_configure_logging_text(root_logging: logging.Logger) -> None:
    stream = io.StringIO()
    stop = configure_logging("text", level=logging.INFO, stream=stream)
    try:
        logging.getLogger("torchbay.serve").info("ready")
    finally:
        stop()
    (line,) = stream.getvalue().splitlines()
    assert line.endswith(" INFO torchbay.serve: ready")


def test_access_fast_path_writes_what_the_standard_path_writes(
    root_logging: logging.Logger, tmp_path
) -> None:
    """The text pipeline formats access lines whole (no LogRecord): the same line as the
    standard path, in order with other records, to the console and to the files that keep it;
    with a filter on the way (``--log-config``, caplog) the standard path runs instead."""
    import re

    from torchbay.server.observe import logs

    access, other = tmp_path / "access.log", tmp_path / "other.log"
    stream = io.StringIO()
    files = {access: lambda r: r.name == ACCESS_LOGGER, other: lambda r: r.name != ACCESS_LOGGER}
    stop = configure_logging("text", level=logging.INFO, stream=stream, files=files)
    request = RequestRecord(SCOPE, "m", None, 200, 0.0123, 0.0004, None)
    try:
        fast = logs._fast_access
        assert fast is not None and fast.applies()
        log_access(request)
        logging.getLogger("torchbay.serve").info("between")
        for _ in range(50):
            log_access(request)
        keep = logging.Filter()  # any filter on the logger: the standard path
        logging.getLogger(ACCESS_LOGGER).addFilter(keep)
        try:
            assert not fast.applies()
            log_access(RequestRecord(SCOPE, "m", "2.0", 503, 0.002, None, None))
        finally:
            logging.getLogger(ACCESS_LOGGER).removeFilter(keep)
    finally:
        stop()
    assert logs._fast_access is None
    lines = stream.getvalue().splitlines()
    assert len(lines) == 53 and lines[1].endswith(" INFO torchbay.serve: between")
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"
    message = (
        '127.0.0.1:5000 "POST /predictions/m HTTP/1.1" 200 model=m version=None '
        "total_ms=12.300 queue_ms=0.4"
    )
    fast_line = re.compile(f"{stamp} INFO {re.escape(ACCESS_LOGGER)}: {re.escape(message)}")
    assert all(fast_line.fullmatch(line) for line in [lines[0], *lines[2:52]]), lines[:3]
    assert re.fullmatch(f"{stamp} INFO {re.escape(ACCESS_LOGGER)}: .* 503 model=m .*", lines[52])
    assert access.read_text().splitlines() == [lines[0], *lines[2:]]
    assert other.read_text().splitlines() == [lines[1]]


@pytest.mark.slow
def test_one_access_line_per_request(live_server, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    server = live_server(models=probe_models())
    assert httpx.post(f"{server.url}/predictions/probe", json={}, timeout=60).status_code == 200
    assert httpx.post(f"{server.url}/predictions/probe/1.0", json={"bad": True}).status_code == 400
    assert httpx.post(f"{server.url}/v2/models/nope/infer", json={}).status_code == 404
    server.recorded()
    lines = [r for r in caplog.records if r.name == ACCESS_LOGGER]
    assert len(lines) == 3, [r.getMessage() for r in lines]
    fields = [dict(zip(ACCESS_FIELDS, r.args, strict=True)) for r in lines]  # type: ignore[arg-type]
    assert [(f["method"], f["path"], f["status"]) for f in fields] == [
        ("POST", "/predictions/probe", 200),
        ("POST", "/predictions/probe/1.0", 400),
        ("POST", "/v2/models/nope/infer", 404),
    ]
    assert [(f["model"], f["version"]) for f in fields] == [
        ("probe", "1.0"),
        ("probe", "1.0"),
        ("nope", None),
    ]
    assert fields[0]["queue_ms"] is not None and fields[0]["queue_ms"] >= 0
    assert fields[0]["total_ms"] >= fields[0]["queue_ms"]
    assert fields[2]["queue_ms"] is None
    assert fields[0]["client"].startswith("127.0.0.1:")


def _raw_post(port: int, target: bytes) -> bytes:
    """POST ``target`` as sent (percent-escapes and all); the status line of the answer."""
    import socket

    request = b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}"
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(request % target)
        answer = b""
        while b"\r\n" not in answer and (chunk := sock.recv(4096)):
            answer += chunk
    return answer.split(b"\r\n")[0]


@pytest.mark.slow
def test_a_client_cannot_break_or_forge_access_lines(
    live_server, caplog: pytest.LogCaptureFixture
) -> None:
    """Line breaks and ANSI escapes in a decoded path, model name or version (HTTP) or in a gRPC
    request's model name are written escaped: each request stays one line of printable text."""
    import numpy as np
    import tritonclient.grpc as triton_grpc

    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    server = live_server(models=probe_models())
    port = server.server.state.ports.inference
    forged = b"%0d%0a2026-01-01%2000:00:00,000%20INFO%20torchbay.access:%20forged"
    for target in (
        b"/predictions/probe" + forged,
        b"/predictions/probe/1.0" + forged,
        b"/v2/models/x%1b[31mred%1b[0m/infer",
    ):
        assert _raw_post(port, target) == b"HTTP/1.1 404 Not Found"
    client = triton_grpc.InferenceServerClient(
        f"127.0.0.1:{server.server.state.ports.grpc_inference}"
    )
    tensor = triton_grpc.InferInput("x", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, np.float32))
    with pytest.raises(Exception, match="forged"):
        client.infer("probe\nforged", [tensor])
    client.close()
    server.recorded()
    lines = [r.getMessage() for r in caplog.records if r.name == ACCESS_LOGGER]
    assert len(lines) == 4, lines
    assert all(line.isprintable() for line in lines), lines
    assert "probe\\r\\n2026-01-01" in lines[0] and "version=1.0\\r\\n2026" in lines[1]
    assert "model=x\\x1b[31mred" in lines[2] and "model=probe\\nforged" in lines[3]


@pytest.mark.slow
def test_a_huge_model_name_writes_a_bounded_access_line(
    live_server, caplog: pytest.LogCaptureFixture
) -> None:
    """A gRPC model name of a million control characters (a message may hold megabytes) is one
    access line of a few KiB, not four megabytes escaped in each log file."""
    import numpy as np
    import tritonclient.grpc as triton_grpc

    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    server = live_server(models=probe_models())
    client = triton_grpc.InferenceServerClient(
        f"127.0.0.1:{server.server.state.ports.grpc_inference}"
    )
    tensor = triton_grpc.InferInput("x", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, np.float32))
    with pytest.raises(Exception, match="unknown model"):
        client.infer("\x01" * 1_000_000, [tensor])
    client.close()
    server.recorded()
    (line,) = [r.getMessage() for r in caplog.records if r.name == ACCESS_LOGGER]
    assert len(line) < 8 * 1024 and line.isprintable()
    assert "model=\\x01\\x01" in line and "...(998976 more characters) version=" in line


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_log_file_leaves_the_writer_and_the_exit_alone(
    root_logging: logging.Logger, tmp_path
) -> None:
    """Every write to a log file fails (ENOSPC): one report of it, the console still gets every
    line, a flush (the barrier ``--start`` waits on) comes back, and the exit does not raise."""
    full = tmp_path / "access.log"
    full.symlink_to("/dev/full")
    stream, errors = io.StringIO(), io.StringIO()
    pipeline = configure_logging("text", level=logging.INFO, stream=stream, files={full: None})
    request = RequestRecord(SCOPE, "m", None, 200, 0.0123, 0.0004, None)
    saved, sys.stderr = sys.stderr, errors  # where logging reports a failed write
    try:
        for _ in range(3):
            log_access(request)
            assert pipeline.flush(timeout=5)
        logging.getLogger("torchbay.serve").info("still writing")
        assert pipeline.flush(timeout=5)
    finally:
        sys.stderr = saved
        pipeline()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4 and lines[-1].endswith("torchbay.serve: still writing")
    assert errors.getvalue().count("--- Logging error ---") == 1


class _StalledConsole(io.StringIO):
    """stderr a pipe that nobody reads: every write waits until the test lets it through."""

    def __init__(self) -> None:
        super().__init__()
        import threading

        self.released = threading.Event()

    def write(self, text: str) -> int:
        self.released.wait(30)
        return super().write(text)


def test_a_stalled_console_drops_the_event_loops_records_past_the_bound(
    root_logging: logging.Logger,
) -> None:
    """While the writer cannot write, the event loop's records (access lines, fast path and
    standard path alike) are held up to ``MAX_QUEUED``, then dropped and counted, never held
    without bound; once the console moves again, every record held is written and one warning
    says how many were dropped. Before, the queue grew with every request."""
    from torchbay.server.observe import logwriter

    stream = _StalledConsole()
    pipeline = configure_logging("text", level=logging.INFO, stream=stream)
    request = RequestRecord(SCOPE, "m", None, 200, 0.0123, 0.0004, None)
    served = 3 * logwriter.MAX_QUEUED
    try:
        for i in range(served):
            log_access(request) if i % 2 else logging.getLogger("torchbay.serve").info("r %d", i)
        assert pipeline.backlog() <= logwriter.MAX_QUEUED
        stream.released.set()
        assert pipeline.flush(timeout=30)
    finally:
        stream.released.set()
        pipeline()
    lines = stream.getvalue().splitlines()
    (warning,) = [line for line in lines if "WARNING" in line]
    dropped = int(warning.split(" WARNING torchbay.logs: ")[1].split()[0])
    assert warning.endswith(
        f"the log writer was {logwriter.MAX_QUEUED} records behind "
        "(a console or a log file that is not being written)"
    )
    assert dropped > 0 and len(lines) - 1 + dropped == served
