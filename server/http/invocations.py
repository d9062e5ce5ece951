"""Which model SageMaker's ``POST /invocations`` names, as TorchServe 0.12 reads it: the
``model_name`` query parameter (torchbay also reads a ``model_name`` header after it); else the
only model loaded at start-up; else the request's form field ``model_name`` (an urlencoded or
multipart body: TorchServe's request parser makes each form field a parameter); else 400.

The body is read for that only when nothing else names the model and it is a form; it is read
as always (``max_request_size``), its form parsed in a thread (pure Python: seconds for a
form of many short lines, which held the event loop), and handed on (:func:`replay`). Torch-free.
"""

from __future__ import annotations

from email.parser import BytesParser
from urllib.parse import parse_qs

from torchbay.server.http.asgi import Message, Receive, Scope, header

_URLENCODED = b"application/x-www-form-urlencoded"
_MULTIPART = b"multipart/form-data"


def named(scope: Scope) -> str | None:
    """The ``model_name`` query parameter (``""`` when given empty: TorchServe's 404), else the
    ``model_name`` header, else None."""
    query = scope.get("query_string", b"").decode("latin-1")
    values = parse_qs(query, keep_blank_values=True).get("model_name")
    if values:
        return values[0]
    value = header(scope, b"model_name")
    return value.decode("latin-1") if value else None


def _media_type(scope: Scope) -> bytes:
    return (header(scope, b"content-type") or b"").split(b";")[0].strip().lower()


def is_form(scope: Scope) -> bool:
    """The body is a form TorchServe reads fields from (urlencoded or multipart)."""
    return _media_type(scope) in (_URLENCODED, _MULTIPART)


def form_field(scope: Scope, body: bytes, name: str) -> str | None:
    """The first value of the form field ``name`` in ``body``, or None (no such field, or a
    body that does not parse as the form its content type says)."""
    if _media_type(scope) == _URLENCODED:
        values = parse_qs(body, keep_blank_values=True).get(name.encode())
        return values[0].decode("utf-8", "replace") if values else None
    head = b"Content-Type: " + (header(scope, b"content-type") or b"") + b"\r\n\r\n"
    message = BytesParser().parsebytes(head + body)
    if not message.is_multipart():
        return None
    for part in message.get_payload():
        if part.get_param("name", header="content-disposition") == name:
            value = part.get_payload(decode=True)
            return value.decode("utf-8", "replace") if isinstance(value, bytes) else None
    return None


def replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` that hands out ``body`` (already read) once more first."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def again() -> Message:
        return pending.pop() if pending else await receive()

    return again
