"""``torchbay serve``'s log files, its workers' output, and ``--log-config``.

TorchServe's layout: ``logs/`` under the current directory (``LOG_LOCATION`` moves it) holds

- ``ts_log.log``: every line the console (stdout) gets (the frontend's log, the access lines and the
  workers' output, as TorchServe's ``ts_log.log`` holds its ACCESS_LOG and MODEL_LOG lines);
- ``access_log.log``: the access lines (``torchbay.access``: one per inference request);
- ``model_log.log``: whatever the workers write on stdout and stderr (their log records, a
  handler's ``print``), logger ``torchbay.model_log``.

Files are appended to and roll over daily and past ``log_file_max_bytes`` (100 MB) into
``ts_log.02-Dec.log.gz``, keeping ``log_file_backups`` (5), as TorchServe's log4j2 configuration
rolls them (rollover.py). TorchServe's
``ts_metrics.log``/``model_metrics.log`` are written by observe.ts_families, and only with
``metrics_mode`` log or legacy. A directory that cannot be written (a read-only container)
leaves the console only, with one warning.

Workers inherit the frontend's stdout and stderr; :class:`WorkerOutput` points both at one pipe
that a thread reads, so their lines reach the same writer as the frontend's records.
"""

from __future__ import annotations

import configparser
import contextlib
import io
import json
import logging
import logging.config
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from torchbay.server.errors import ConfigError, TorchbayError
from torchbay.server.observe.logs import ACCESS_LOGGER, RecordFilter
from torchbay.server.observe.logwriter import printable

MODEL_LOGGER = "torchbay.model_log"
SERVER_LOG, ACCESS_LOG, MODEL_LOG = "ts_log.log", "access_log.log", "model_log.log"
# A worker's output line ends at LF, CR or CRLF (a progress bar's updates end with CR only, as
# Java's readLine, TorchServe's reader, takes them); one longer than MAX_LINE bytes is cut in
# pieces of that size: a handler writing without a newline never grows the reader's buffer.
_EOL = re.compile(rb"\r\n|\r|\n")
MAX_LINE = 64 * 1024
# The workers' output waits in their pipe while the writer is this many records behind.
MAX_BACKLOG = 1000

log = logging.getLogger("torchbay.logs")


def log_dir(env: Mapping[str, str]) -> Path:
    """``$LOG_LOCATION``, else ``logs`` under the current directory (TorchServe's)."""
    return Path(env.get("LOG_LOCATION") or "logs")


def log_files(directory: Path) -> tuple[dict[Path, RecordFilter | None], str | None]:
    """The files :func:`~torchbay.server.observe.logs.configure_logging` writes, with a filter
    each, or ``({}, why)`` when ``directory`` cannot be written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name in (SERVER_LOG, ACCESS_LOG, MODEL_LOG):
            with (directory / name).open("a", encoding="utf-8"):
                pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        return {}, f"cannot write log files in {directory} ({reason.lower()}): console only"
    return {
        directory / SERVER_LOG: None,
        directory / ACCESS_LOG: _named(ACCESS_LOGGER),
        directory / MODEL_LOG: _named(MODEL_LOGGER),
    }, None


def _named(name: str) -> RecordFilter:
    return lambda record: record.name == name


def _lines(pipe: Any) -> Iterator[bytes]:
    """The lines read from ``pipe`` (a buffered binary file), without their ends, each at most
    MAX_LINE bytes (see ``_EOL``)."""
    buf = b""
    while chunk := pipe.read1(MAX_LINE):
        *lines, buf = _EOL.split(buf + chunk)
        yield from lines
        while len(buf) >= MAX_LINE:
            yield buf[:MAX_LINE]
            buf = buf[MAX_LINE:]
    if buf:
        yield buf


class WorkerOutput:
    """fds 1 and 2 (what workers inherit) become one pipe at ``start``; the frontend keeps
    copies of both.

    ``console`` is the frontend's log stream: stdout as it was (TorchServe logs to stdout);
    ``sys.stdout``/``sys.stderr`` write where they did. ``start(pipeline)`` reads the pipe on a
    thread: a line that starts with ``tag`` (a worker's log record, serving/worker_env.LOG_TAG) is
    written as the worker formatted it, less the tag; anything else (a ``print``, a record's
    further lines, text a handler logged with line breaks in it) becomes a ``torchbay.model_log``
    record, as TorchServe prefixes every line of its workers': a worker's output never passes for
    a record of the server's. A character that is not printable (an ANSI escape that moves a
    terminal's cursor and erases the line above) is written escaped, as in the access log
    (TorchServe writes it raw). ``close()`` puts fds 1 and 2 back and waits (bounded) for the
    workers' last lines.

    While the writer is ``MAX_BACKLOG`` records behind (stdout a pipe that nobody reads), the
    thread stops reading: the workers' output waits in their pipe and a worker that writes more
    waits too, as TorchServe's reader blocks on its log. It piled up in the frontend's memory
    (100 MB printed: 155 MB more held).
    """

    def __init__(self, tag: str = "") -> None:
        self.tag = tag
        sys.stdout.flush()
        sys.stderr.flush()
        self._out_fd, self._err_fd = os.dup(1), os.dup(2)
        self._read, self._write = os.pipe()
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout = open(self._out_fd, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(self._err_fd, "w", buffering=1, closefd=False)  # noqa: SIM115
        self.console: TextIO = open(self._out_fd, "w", buffering=1 << 16, closefd=False)  # noqa: SIM115
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()

    def start(self, pipeline: Any) -> None:
        """Point fds 1 and 2 at the pipe and read it. Only now, once the log files are open: a
        log file linked to ``/dev/stdout`` opened the pipe otherwise, and each line written to
        it came back as a worker's, to be logged again, without end."""
        os.dup2(self._write, 1)
        os.dup2(self._write, 2)
        os.close(self._write)
        self._thread = threading.Thread(
            target=self._pump, args=(pipeline,), name="torchbay-worker-output", daemon=True
        )
        self._thread.start()

    def _pump(self, pipeline: Any) -> None:
        with open(self._read, "rb") as pipe:
            for raw in _lines(pipe):
                while pipeline.backlog() > MAX_BACKLOG and not self._closing.is_set():
                    self._closing.wait(0.01)
                line = raw.decode("utf-8", "replace")
                if self.tag and line.startswith(self.tag):
                    pipeline.put_line(MODEL_LOGGER, printable(line[len(self.tag) :]))
                elif line:
                    pipeline.put_message(MODEL_LOGGER, printable(line))

    def detach_console(self, stderr_to: Path | None = None) -> None:
        """A server started with ``--start``, once up: stdout goes to /dev/null (every log line
        is in the files already), ``sys.stderr`` (a last traceback) is appended to ``stderr_to``
        by its name, each write: the file rolls over (rollover.py), and an open file would be
        the archive by then, gzipped and deleted. A console nobody reads any more (the
        ``--start`` process interrupted, its terminal closed) loses what it held: the server
        goes on."""
        for stream in (sys.stdout, sys.stderr, self.console):
            with contextlib.suppress(OSError):  # BrokenPipeError
                stream.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._out_fd)
        os.dup2(devnull, self._err_fd)
        os.close(devnull)
        if stderr_to is not None:
            sys.stderr = AppendTo(stderr_to)

    def close(self, timeout: float = 5.0, then: Callable[[], object] | None = None) -> None:
        """Put fds 1 and 2 back, wait (``timeout``) for the workers' last lines, run ``then``
        (the log pipeline's stop: it writes what it holds to ``console``), close the console."""
        self._closing.set()
        for stream, fd in ((sys.stdout, self._out_fd), (sys.stderr, self._err_fd)):
            try:
                stream.flush()
            except OSError:  # a console nobody reads any more (`| tee` gone with the Ctrl-C):
                _to_devnull(fd)  # what it held is lost, and no later flush fails (exit 120)
        sys.stdout, sys.stderr = self._saved
        os.dup2(self._out_fd, 1)  # the pipe's last writers are now the workers, if any
        os.dup2(self._err_fd, 2)
        if self._thread is not None:
            self._thread.join(timeout)
        else:  # never started
            os.close(self._read)
            os.close(self._write)
        if then is not None:
            then()
        os.close(self._out_fd)
        os.close(self._err_fd)


class AppendTo(io.TextIOBase):
    """A text stream that appends each write to ``path``, opened by name for that write (a file
    that rolls over is followed); a write that fails is lost."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with (
            contextlib.suppress(OSError),
            open(self.path, "a", encoding="utf-8", errors="backslashreplace") as out,
        ):
            out.write(text)
        return len(text)


def _to_devnull(fd: int) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


_REFUSED = (ValueError, TypeError, AttributeError, ImportError, KeyError)


@dataclass(frozen=True)
class LogConfig:
    """A ``--log-config`` file, read before anything starts and applied once logging is up."""

    path: Path
    kind: str  # "dict" (JSON or YAML: logging.config.dictConfig), "ini" (fileConfig), "log4j"
    data: dict[str, Any] | None = None

    def apply(self) -> None:
        if self.kind == "log4j":
            log.warning(
                "--log-config %s is a log4j2 file: torchbay logs through Python's logging and "
                "ignores it (give a dictConfig JSON/YAML or a fileConfig INI file instead)",
                self.path.name,
            )
            return
        try:
            if self.kind == "dict":
                logging.config.dictConfig(self.data or {})
            else:
                logging.config.fileConfig(self.path, disable_existing_loggers=False)
        # OSError: a log file that cannot be opened; NameError, SyntaxError: fileConfig
        # evaluates a handler's args.
        except (*_REFUSED, OSError, NameError, SyntaxError) as exc:
            raise ConfigError(f"--log-config {self.path.name}: {_reason(exc)}") from None
        log.info("logging configured from %s", self.path.name)


def read_log_config(value: str) -> LogConfig:
    """Read and check ``--log-config`` (an error names the file, never applies half of it)."""
    path = Path(value)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TorchbayError(f"--log-config file not found: {value}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TorchbayError(f"cannot read --log-config {value}: {exc}") from None
    if path.suffix.lower() == ".xml" or text.lstrip().startswith("<"):
        return LogConfig(path, "log4j")
    if path.suffix.lower() in (".ini", ".cfg", ".conf"):
        parser = configparser.ConfigParser()
        try:
            parser.read_string(text)
        except configparser.Error as exc:
            raise ConfigError(f"--log-config {path.name}: {_first_line(exc)}") from None
        if not parser.has_section("loggers"):
            raise ConfigError(f"--log-config {path.name}: no [loggers] section (fileConfig)")
        return LogConfig(path, "ini")
    loader: Callable[[str], Any] = json.loads if path.suffix.lower() == ".json" else yaml.safe_load
    try:
        data = loader(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"--log-config {path.name}: {_first_line(exc)}") from None
    if not isinstance(data, dict) or "version" not in data:
        raise ConfigError(
            f"--log-config {path.name}: not a logging dictConfig (a mapping with 'version: 1')"
        )
    # Python's default (True) would silence every logger the server already made: ours.
    data.setdefault("disable_existing_loggers", False)
    return LogConfig(path, "dict", data)


def _reason(exc: BaseException) -> str:
    """Why a config was refused, on one line: dictConfig's "Unable to configure handler 'f'"
    with its cause (a log file's folder that does not exist)."""
    reason = _first_line(exc)
    if exc.__cause__ is not None:
        reason = f"{reason}: {_first_line(exc.__cause__)}"
    return reason


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
