"""The handlers' exception tree (imports nothing of ours, nor torch).

    HandlerError                       base of every handler-side failure
    ├── HandlerLoadError               the model or handler failed to load (unknown handler name,
    │                                  missing file, bad module, unreadable weights...)
    └── PredictionException            raised by a handler during inference; TorchServe's
        │                              ``PredictionException(message, error_code=500)``
        ├── BadInput                   one request's input is unusable (error_code 400)
        └── UnprocessableInput         a well-formed input the model cannot process (422)

The Service re-runs a batch whose ``handle()`` raised on smaller parts until the failing request
stands alone, then answers it with the ``error_code`` (see service.py); a ``BadInput`` raised inside
``BaseHandler.map_items`` fails only its own request.

``scrub_message`` is the one gate every error message passes before it goes into a response body:
no traceback, no filesystem path.
"""

from __future__ import annotations

import re
import signal

_MAX_MESSAGE = 1000
# A line that starts a traceback (Python's, or TorchScript's interpreter report).
_TRACEBACK_LINE = re.compile(
    r"^\s*(Traceback \(most recent|File \"|Traceback of TorchScript|at .*\.py:\d+"
    r"|.*\.py\", line \d+)",
)
# Absolute POSIX paths (two or more segments, or one with a file suffix), Windows drive paths
# and file:// URLs.
_PATH = re.compile(
    r"file://\S+"
    r"|(?<![\w.:/~-])~?/(?:[\w.@+-]+/)+[\w.@+-]*"
    r"|(?<![\w.:/~-])/[\w@+-]+\.[A-Za-z0-9]{1,8}\b"
    r"|\b[A-Za-z]:\\[^\s\"']+"
)


def scrub_message(message: object) -> str:
    """``message`` made safe for a response body.

    Cuts everything from the first line that looks like a traceback, replaces absolute
    filesystem paths with ``<path>`` and caps the length at 1000 characters.
    """
    text = str(message)
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if _TRACEBACK_LINE.match(line):
            lines = lines[:i]
            break
    text = "\n".join(lines).strip() or "(details withheld; see the worker log)"
    text = _PATH.sub("<path>", text)
    if len(text) > _MAX_MESSAGE:
        text = text[: _MAX_MESSAGE - 3] + "..."
    return text


def failure_message(exc: BaseException, request_ids: list[str] | tuple[str, ...]) -> str:
    """The generic body message for an exception that is not a ``PredictionException``."""
    ids = ", ".join(str(r) for r in request_ids) or "unknown"
    noun = "request id" if len(request_ids) <= 1 else "request ids"
    return scrub_message(f"The handler failed on this request ({type(exc).__name__}); {noun} {ids}")


def handler_fault(exc: BaseException) -> bool:
    """Whether ``exc``, raised by handler code, is the handler's failure to answer rather than a
    reason to stop: any exception, ``SystemExit`` and ``GeneratorExit``, and a
    ``KeyboardInterrupt`` where no Ctrl-C can have caused it (the worker ignores SIGINT, so
    there one comes from the handler itself; ``torchbay verify`` still stops on Ctrl-C)."""
    if isinstance(exc, KeyboardInterrupt):
        return signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    return True


class HandlerError(Exception):
    """Base of every error raised by ``torchbay.handlers``."""


class HandlerLoadError(HandlerError):
    """The model or handler could not be loaded; the message names the file or handler."""


class PredictionException(HandlerError):
    """TorchServe-compatible inference error carrying the HTTP status to answer with."""

    def __init__(self, message: str, error_code: int = 500) -> None:
        super().__init__(message)
        self.message = message
        self.error_code = int(error_code)

    def __str__(self) -> str:
        return f"{self.message} : {self.error_code}"


class BadInput(PredictionException):
    """One request's input is invalid: answered 400 (only that request, inside map_items)."""

    def __init__(self, message: str, error_code: int = 400) -> None:
        super().__init__(message, error_code)


class UnprocessableInput(PredictionException):
    """A well-formed input the model cannot process (wrong shape or dtype): answered 422."""

    def __init__(self, message: str, error_code: int = 422) -> None:
        super().__init__(message, error_code)


def error_status(code: object) -> int:
    """A handler's error code when it is an HTTP error status (400..599), else 500."""
    return code if type(code) is int and 400 <= code <= 599 else 500
