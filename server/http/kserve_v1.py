"""KServe v1 predict on the frontend: ``POST /v1/models/{m}:predict`` with ``{"instances": [...]}``
answers ``{"predictions": [...]}``, as TorchServe's ``kserve`` envelope does.

Each instance becomes one request to the model's queue (see ``encode_instance`` for the row the
handler gets); the batcher groups them like any other requests and the results come back
in order. No worker or handler change: a handler that answers ``/predictions`` answers this too.
Every instance is admitted before any is awaited; if one is refused (queue full, no worker), the
ones already queued are cancelled (the batcher skips them) and the call gets that one error.
The first failed instance's status and body are the response. Torch-free.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlencode

from torchbay.server.errors import BadRequest, TorchbayError
from torchbay.server.http.asgi import Receive, Scope, Send, read_body, send_bytes, send_json
from torchbay.server.observe.logs import RequestHook, RequestRecord
from torchbay.server.serving import protocol as p
from torchbay.server.serving.admission import refuse_early
from torchbay.server.serving.queue import Pending

if TYPE_CHECKING:
    from torchbay.server.serving.model import ModelVersion
    from torchbay.server.serving.registry import ModelRegistry


class Listener(Protocol):
    """What v1 predict needs of the inference listener that routes to it (server.http.inference
    implements it): its registry, limits, hooks, and how it builds a WireRequest."""

    registry: ModelRegistry
    max_request_size: int
    authorize: Callable[[Scope, str], None] | None
    on_request: RequestHook | None

    def _wire_request(self, scope: Scope, body: bytes, protocol: str) -> p.WireRequest: ...


# The body is re-encoded here: its framing and its coding headers do not carry over.
_DROPPED_HEADERS = (b"content-type", b"content-length", b"transfer-encoding", b"content-encoding")


def parse_instances(body: bytes) -> list[Any]:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from exc
    instances = data.get("instances") if isinstance(data, dict) else None
    if not isinstance(instances, list) or not instances:
        raise BadRequest('KServe v1 body must be {"instances": [...]} with at least one instance')
    return instances


def encode_instance(instance: Any) -> tuple[bytes, bytes]:
    """One instance as a request body. An object of strings (``{"data": "<base64>"}``, KServe's
    image examples) goes form-encoded, so the handler's row IS the instance, as with
    TorchServe's kserve envelope; anything else goes as JSON (row ``{"body": instance}``)."""
    if (
        isinstance(instance, dict)
        and instance
        and all(isinstance(v, str) for v in instance.values())
    ):
        return urlencode(instance).encode(), b"application/x-www-form-urlencoded"
    return json.dumps(instance).encode(), b"application/json"


def decode_prediction(response: p.WireResponse) -> Any:
    """A handler's answer to one instance: JSON when it is JSON, else text."""
    try:
        return json.loads(response.body)
    except (ValueError, UnicodeDecodeError):
        return response.body.decode("utf-8", "replace")


async def predict(app: Listener, scope: Scope, receive: Receive, send: Send, name: str) -> None:
    """Answer one v1 predict call on model ``name``, reported once to the app's request hook."""
    started = time.perf_counter()
    mv: ModelVersion | None = None
    items: list[Pending[p.WireRequest, p.WireResponse]] = []
    status = 500
    try:
        if app.authorize is not None:
            app.authorize(scope, "inference")
        mv = app.registry.resolve(name, None)
        refuse_early(mv)  # 503 from the headers alone: the body is never read
        instances = parse_instances(await read_body(scope, receive, app.max_request_size))
        items = _admit_all(app, mv, scope, instances)
        status = await _answer(mv, items, send)
    except TorchbayError as exc:
        status = exc.status
        raise
    finally:
        if app.on_request is not None:
            waited = [i.dispatched - i.arrival for i in items if i.dispatched is not None]
            seconds = time.perf_counter() - started
            queue_s = max(waited, default=None)
            app.on_request(RequestRecord(scope, name, None, status, seconds, queue_s, mv))


async def _answer(
    mv: ModelVersion, items: list[Pending[p.WireRequest, p.WireResponse]], send: Send
) -> int:
    mv.inflight += len(items)
    try:
        results = await asyncio.gather(*(item.future for item in items), return_exceptions=True)
    finally:
        mv.inflight -= len(items)
    for result in results:
        if isinstance(result, BaseException):
            raise result  # TorchbayError (worker died, timeout): the app sends it
    failed = next((r for r in results if r.status >= 400), None)
    if failed is not None:
        await send_bytes(send, failed.status, failed.body, failed.content_type.encode("latin-1"))
        return failed.status
    await send_json(send, 200, {"predictions": [decode_prediction(r) for r in results]})
    return 200


def _admit_all(
    app: Listener, mv: ModelVersion, scope: Scope, instances: list[Any]
) -> list[Pending[p.WireRequest, p.WireResponse]]:
    headers = [(k, v) for k, v in scope["headers"] if k not in _DROPPED_HEADERS]
    items: list[Pending[p.WireRequest, p.WireResponse]] = []
    try:
        for instance in instances:
            body, content_type = encode_instance(instance)
            one = {**scope, "headers": [*headers, (b"content-type", content_type)]}
            items.append(mv.admit(app._wire_request(one, body, "predict")))
    except TorchbayError:
        for item in items:
            item.future.cancel()
        raise
    return items
