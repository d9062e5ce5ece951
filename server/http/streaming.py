"""Streamed HTTP answers: chunked transfer encoding (TorchServe's ``/predictions`` when the
handler sends intermediate parts) and server-sent events (the generate extension's
``/generate_stream``), plus the generate extension's JSON (``/generate``).

A stream's first part decides the status and headers. Later parts are written as they arrive,
each flushed (one ASGI body message each; uvicorn frames them as HTTP/1.1 chunks). A handler
error after the first part cannot change the status any more: its error body is the stream's
last chunk (an SSE ``data: {"error": ...}`` event). While a stream is open the client's
disconnect (ASGI ``http.disconnect``) is watched: the stream is closed, which cancels the
request and tells its worker to stop producing for it (``ModelVersion.stream``). Each part is
sent once uvicorn's write buffer drains; a client that reads slower than the handler produces
lets its parts wait, up to ``max_response_size`` bytes, then its stream ends with a SlowReader
error (serving/streams.py). An
HTTP/1.0 client cannot read chunked transfer encoding (RFC 9112 6.1, a server MUST NOT send it):
its stream is gathered and answered whole, with its length (:func:`whole`).

Generate extension (Triton's ``extension_generate.md``): each part becomes one
``{"model_name", "model_version", "text_output", ...}`` object: a JSON object part is taken as
it is (the two names added), any other part is the text of ``text_output``. ``/generate``
answers one object: the parts' ``text_output`` joined, their other fields merged (later parts
win). Errors are ``{"error": message}``. Torch-free.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from torchbay.server.errors import BadRequest, TorchbayError
from torchbay.server.http.asgi import Message, Receive, Scope, Send, dumps, header, send_bytes
from torchbay.server.plane import Gathered, ModelVersion, WireResponse

Parts = AsyncIterator[WireResponse]
_SSE = b"text/event-stream; charset=utf-8"


async def _disconnected(receive: Receive) -> None:
    """Return when the client has gone away (the request body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def follow(parts: Parts, receive: Receive) -> AsyncIterator[WireResponse | TorchbayError]:
    """The rest of ``parts`` (an error that ends the stream is yielded as the last item);
    stops early, closing ``parts``, when the client disconnects."""
    watcher = asyncio.ensure_future(_disconnected(receive))
    step: asyncio.Future | None = None
    try:
        while True:
            step = asyncio.ensure_future(anext(parts))
            await asyncio.wait((step, watcher), return_when=asyncio.FIRST_COMPLETED)
            if not step.done():  # the client left: cancelling the step cancels the request
                step.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, TorchbayError):
                    await step
                return
            try:
                yield step.result()
            except StopAsyncIteration:
                return
            except TorchbayError as exc:
                yield exc
                return
    finally:
        watcher.cancel()
        if step is not None and not step.done():  # we were cancelled ourselves
            step.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, TorchbayError):
                await step
        await parts.aclose()


async def send_chunked(
    send: Send,
    receive: Receive,
    first: WireResponse,
    parts: Parts,
    headers: list[tuple[bytes, bytes]],
) -> None:
    """``first`` (already checked: ``headers`` include its content type) and the rest of
    ``parts`` as one chunked response; an error that ends it is its TorchServe error body."""
    await send({"type": "http.response.start", "status": first.status, "headers": headers})
    await send({"type": "http.response.body", "body": first.body, "more_body": True})
    async for item in follow(parts, receive):
        body = dumps(item.to_json()) if isinstance(item, TorchbayError) else item.body
        if body:
            await send({"type": "http.response.body", "body": body, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def whole(send: Send, scope: Scope, limit: int) -> Send:
    """``send`` for a streamed answer: as it is, or for an HTTP/1.0 client (no chunked transfer
    encoding) one that gathers the body messages and sends them as one, with its length; past
    ``limit`` bytes (``max_response_size``, 0: none) it raises, nothing sent (see ``gather``)."""
    if scope.get("http_version") != "1.0":
        return send
    start: dict[str, Any] = {}
    chunks: list[bytes] = []
    size = Gathered(limit)

    async def gathered(message: Message) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
            return
        chunks.append(size.add(message.get("body", b"")))
        if message.get("more_body", False):
            return
        body = b"".join(chunks)
        headers = [(k, v) for k, v in start.get("headers", ()) if k != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return gathered


# -- the generate extension -----------------------------------------------------------------


# The generate body's content type: JSON, whose row must be one object (the worker refuses
# anything else with 400: handlers/runtime/envelopes.GENERATE_ROW).
_GENERATE_JSON = b"application/json; torchbay-row=generate"
GENERATE_MESSAGE = "The generate request body must be a JSON object"


def as_json(scope: Scope) -> Scope:
    """The generate extension's body is JSON whatever its content type says (``curl -d`` sends
    a form type): the handler gets the decoded object as TorchServe's ``body``, its row marked
    (handlers/runtime/envelopes.GENERATE_ROW): one JSON object, and an answer that is JSON as a
    KServe v1 instance's is (a tensor the handler returns is its values, not /predictions'
    torch.save bytes). The scope is changed in place: the HTTP protocol reads the request's
    hooks from it (disconnect.py)."""
    headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
    scope["headers"] = [*headers, (b"content-type", _GENERATE_JSON)]
    return scope


def json_object(scope: Scope, body: bytes) -> None:
    """A generate body is one JSON object (its keys: the inputs and parameters), as Triton
    requires. What the bytes show at once (empty, not starting with ``{``) is a 400 here; the
    rest, a compressed body's too, is the worker's to check when it parses the body (a 400
    there, never a call of the handler with the raw bytes). The frontend never parses it: a
    body of ``max_request_size`` bytes holds the event loop for seconds."""
    if header(scope, b"content-encoding") is not None:
        return
    if body.lstrip(b" \t\r\n")[:1] != b"{" or body.rstrip(b" \t\r\n")[-1:] != b"}":
        raise BadRequest(GENERATE_MESSAGE)


def generate_object(response: WireResponse, name: str, version: str) -> dict[str, Any]:
    """One part (or a final response) as a generate response object (or ``{"error"}``)."""
    if response.status >= 400:
        return {"error": _error_message(response)}
    value: Any = None
    if response.content_type.startswith("application/json"):
        with contextlib.suppress(ValueError):
            value = json.loads(response.body)
    if isinstance(value, dict):
        return {"model_name": name, "model_version": version, **value}
    text = response.body.decode("utf-8", "replace") if value is None else None
    if text is None:
        text = value if isinstance(value, str) else json.dumps(value)
    return {"model_name": name, "model_version": version, "text_output": text}


def _error_message(response: WireResponse) -> str:
    with contextlib.suppress(ValueError):
        body = json.loads(response.body)
        if isinstance(body, dict):
            return str(body.get("error") or body.get("message") or body)
    return response.body.decode("utf-8", "replace") or f"status {response.status}"


def join_generated(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """``/generate``'s one answer: the ``text_output``s joined, other fields merged."""
    joined: dict[str, Any] = {}
    texts = []
    for obj in objects:
        text = obj.get("text_output")
        if isinstance(text, str):
            texts.append(text)
        joined.update({k: v for k, v in obj.items() if k != "text_output"})
    joined["text_output"] = "".join(texts)
    return joined


async def send_events(
    send: Send,
    receive: Receive,
    first: WireResponse,
    parts: Parts,
    event: Callable[[WireResponse], dict[str, Any]],
) -> None:
    """``first`` and the rest of ``parts`` as server-sent events, ``data: {json}`` each."""
    headers = [(b"content-type", _SSE), (b"cache-control", b"no-cache")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": _sse(event(first)), "more_body": True})
    async for item in follow(parts, receive):
        if isinstance(item, TorchbayError):
            data = {"error": item.message}
        elif item.partial or item.body:
            data = event(item)
        else:
            continue
        await send({"type": "http.response.body", "body": _sse(data), "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def respond_generate(
    send: Send, receive: Receive, first: WireResponse, parts: Parts, mv: ModelVersion
) -> int:
    """``/generate``: every part gathered into one JSON answer (at most the model's
    ``max_response_size`` bytes of parts, see ``Gathered``); its status."""
    name, version = mv.name, mv.version
    objects = [generate_object(first, name, version)]
    size = Gathered(mv.settings.max_response_size)
    size.add(first.body)
    async for item in follow(parts, receive) if first.status < 400 else _nothing():
        if isinstance(item, TorchbayError):
            raise item  # nothing was sent yet: answered as any error of this route
        size.add(item.body)
        if item.status >= 400:
            first, objects = item, [generate_object(item, name, version)]
            break
        if item.partial or item.body:
            objects.append(generate_object(item, name, version))
    status = first.status if first.status >= 400 else 200
    await send_bytes(send, status, dumps(objects[0] if status >= 400 else join_generated(objects)))
    return status


async def respond_generate_stream(
    send: Send, receive: Receive, first: WireResponse, parts: Parts, mv: ModelVersion
) -> int:
    """``/generate_stream``: an error first answer is plain JSON; else server-sent events, sent
    as they come (the parts' buffer bounds a slow reader)."""
    event = functools.partial(generate_object, name=mv.name, version=mv.version)
    if first.status >= 400:
        await send_bytes(send, first.status, dumps(event(first)))
        return first.status
    await send_events(send, receive, first, parts, event)
    return 200


async def _nothing() -> AsyncIterator[Any]:
    return
    yield


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + dumps(data) + b"\n\n"
