"""What the HTTP edge limits (limits.py) decide without a connection: each listener's cap on open
connections from the process's open-file limit, which transfer codings a request may use, and
the bytes of an answer written by the protocol itself. Torch-free.
"""

from __future__ import annotations

import json
import resource
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

_TYPES = {
    408: "RequestTimeout",
    431: "RequestHeaderFieldsTooLarge",
    501: "NotImplemented",
    503: "ServiceUnavailable",
}
_MOST_FILES = 1 << 20  # the most open files assumed (an infinite limit, Linux's usual nr_open)


def connection_cap(listeners: int) -> int:
    """Each of ``listeners``' share of three quarters of the open-file limit (the last quarter
    is left to the workers' pipes and sockets, logs, archives and gRPC), at least 64. The soft
    limit is raised to the hard one first, as Go's runtime does: 1024 is a common soft default."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    usable = _finite(soft)
    if usable < _finite(hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (_finite(hard), hard))
            usable = _finite(hard)
        except (ValueError, OSError):  # the kernel's nr_open may be lower: keep the soft limit
            pass
    return max(64, usable * 3 // 4 // max(1, listeners))


def _finite(limit: int) -> int:
    return _MOST_FILES if limit == resource.RLIM_INFINITY else min(limit, _MOST_FILES)


def unknown_transfer_coding(value: bytes) -> str | None:
    """A transfer coding other than ``chunked`` in ``value``, or None. The request is refused
    with 501 (nginx's answer; RFC 9112 6.1): httptools reads ``gzip, chunked`` as chunked and
    would hand the body on still gzipped, as if it were the body."""
    for coding in value.split(b","):
        coding = coding.strip(b" \t").lower()
        if coding and coding != b"chunked":
            return coding[:64].decode("latin-1")
    return None


def error_bytes(
    server_state: Any, status: int, message: str, url: bytes = b"", extra: bytes = b""
) -> bytes:
    """A whole ``connection: close`` answer with the server's error JSON: OIP's ``{"error"}``
    when the request's target ``url`` is a ``/v2`` path, TorchServe's otherwise."""
    if url.startswith(b"/v2"):
        body = json.dumps({"error": message}).encode()
    else:
        body = json.dumps({"code": status, "type": _TYPES[status], "message": message}).encode()
    head = b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n%s"
    return answer_bytes(status, server_state.default_headers, body, head % (len(body), extra))


def answer_bytes(
    status: int, headers: list[tuple[bytes, bytes]], body: bytes, more: bytes = b""
) -> bytes:
    """A whole answer as uvicorn's ``send`` writes it; ``more``: header lines already written."""
    content = [STATUS_LINE[status]]
    for name, value in headers:
        content.extend([name, b": ", value, b"\r\n"])
    content += [more, b"\r\n", body]
    return b"".join(content)
