"""The requests of record.py, shared with the torchbay test that replays them: each names the
kind of result the handler returns (results_handler.py), sent as text to
``/predictions/results``."""

from __future__ import annotations

import http.client
import io

KINDS = [
    "str",
    "json_str",
    "typed_str",
    "header",
    "created",
    "teapot",
    "bytes",
    "typed_bytes",
    "dict",
    "list",
    "number",
    "none",
    "teapot_none",
    "tensor",
]
HEADERS = ("X-Custom",)


def _body(raw: bytes) -> object:
    """The body as a record keeps it: a torch.save'd tensor as its values, else latin-1 text."""
    if raw.startswith(b"PK"):  # a zip: what torch.save writes
        import torch

        return {"torch.load": torch.load(io.BytesIO(raw)).tolist()}
    return raw.decode("latin-1")


def ask(port: int, kind: str) -> dict:
    """One case's answer: status, reason, content type, the handler's header and the body."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        connection.request("POST", "/predictions/results", kind, {"Content-Type": "text/plain"})
        response = connection.getresponse()
        raw = response.read()
        return {
            "status": response.status,
            "reason": response.reason,
            "content_type": response.getheader("content-type"),
            "headers": {name: response.getheader(name) for name in HEADERS},
            "body": _body(raw),
        }
    finally:
        connection.close()
