"""The worker's response bodies: ``Response``, error bodies, JSON encoding, header validation.

Torch-free. Every JSON body goes through ``dumps`` (valid JSON always: NaN and +-Infinity become
``null``) and every error body through ``error_response`` (its message through
``errors.scrub_message``: no traceback, no filesystem path).
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import PredictionException, error_status, failure_message, scrub_message


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


def dumps(value: Any) -> bytes:
    """Compact JSON; non-finite floats are written as ``null`` (as JSON.stringify and orjson do).

    Raises TypeError/ValueError/RecursionError for a value that cannot be JSON at all.
    """
    try:
        return _dumps(value)
    except ValueError:  # NaN or Infinity somewhere (or a circular reference: raised again below)
        return _dumps(_finite(value))


def _dumps(value: Any) -> bytes:
    if _ENCODE is None:  # no C accelerator: the standard library's way
        return json.dumps(
            value, separators=(",", ":"), default=_json_default, allow_nan=False
        ).encode()
    return "".join(_ENCODE(value, 0)).encode()


def _json_default(value: Any) -> Any:
    # numpy scalars/arrays and tensors, without importing either here.
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


# One C encoder for every body: what json.dumps(value, separators=(",", ":"), default=...,
# allow_nan=False) builds on each call (an encoder object and its C twin, about 1.3 us of a 2 us
# call for a small dict), made once. No circular-reference markers: a value that contains
# itself raises RecursionError instead of ValueError (both are reported as a handler error).
def _encoder() -> Any:
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    # markers, default, encoder, indent, key and item separators, sort_keys, skipkeys, allow_nan
    ascii_strings = json.encoder.encode_basestring_ascii
    return make(None, _json_default, ascii_strings, None, ":", ",", False, False, False)


_ENCODE = _encoder()


def _finite(value: Any) -> Any:
    """``value`` with every NaN/Infinity float replaced by None (numpy/tensors converted)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if hasattr(value, "tolist") or hasattr(value, "item"):
        return _finite(_json_default(value))
    return value  # json.dumps reports what it cannot encode


def error_response(status: int, kind: str, message: str, v2: bool = False) -> Response:
    """``{"code", "type", "message"}`` (plus OIP's ``error`` for v2), the message scrubbed."""
    message = scrub_message(message)
    body: dict[str, Any] = {"code": status, "type": kind, "message": message}
    if v2:
        body["error"] = message  # the OIP error field
    return Response(status, dumps(body))


def prediction_error(exc: PredictionException, v2: bool) -> Response:
    """A handler's PredictionException as its request's response (its ``error_code`` when that is
    an HTTP error status, else 500)."""
    return error_response(error_status(exc.error_code), type(exc).__name__, exc.message, v2)


# RFC 7230 token characters for header names.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Headers that describe the framing of the message: the frontend owns them.
FRAMING_HEADERS = frozenset({"content-length", "transfer-encoding", "connection"})


def status_problem(status: object) -> str | None:
    """Why ``status`` is not an HTTP status (an int 100..599, bool excluded), or None."""
    if type(status) is not int or not 100 <= status <= 599:
        return f"status {status!r} is not an int in 100..599"
    return None


def header_problem(name: object, value: object) -> str | None:
    """Why ``name: value`` cannot be sent as a response header, or None."""
    if not isinstance(name, str) or not _TOKEN.fullmatch(name):
        return f"header name {name!r} is not an RFC 7230 token"
    if not isinstance(value, str):
        return f"header {name!r} has a {type(value).__name__} value, not str"
    if any(c in value for c in "\r\n\0"):
        return f"header {name!r} has a CR, LF or NUL in its value"
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return f"header {name!r} has a value that is not latin-1"
    return None


# The Service's logger: a request that cannot be decoded is logged where its batch is served.
_service_log = logging.getLogger("torchbay.handlers.runtime.service")


def decode_failure(exc: Exception, rid: str, v2: bool) -> Response:
    """The answer to request ``rid`` whose body could not be decoded (see service.py's classes:
    400 bad input, 413 too large, a PredictionException's own status, else 500)."""
    if isinstance(exc, PredictionException):
        return prediction_error(exc, v2)
    if isinstance(exc, RecursionError):
        message = f"input nested too deeply to decode; request id {rid}"
        return error_response(400, "BadInput", message, v2)
    if isinstance(exc, (MemoryError, OverflowError)):
        message = f"input too large to decode ({type(exc).__name__}); request id {rid}"
        return error_response(413, "RequestTooLarge", message, v2)
    _service_log.error("decoding request %s failed", rid, exc_info=exc)
    if isinstance(exc, (ValueError, TypeError, LookupError)):  # UnicodeError is a ValueError
        message = f"input cannot be decoded ({type(exc).__name__}); request id {rid}"
        return error_response(400, "BadInput", message, v2)
    return error_response(500, type(exc).__name__, failure_message(exc, [rid]), v2)
