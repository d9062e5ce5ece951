"""KServe v1 on the inference listener: ``POST /v1/models/{m}:predict`` with
``{"instances": [...]}`` answers ``{"predictions": [...]}``, as TorchServe's ``kserve`` envelope
does; ``GET /`` (liveness ``{"status": "alive"}``), ``GET /v1/models`` (``{"models": [...]}``)
and ``GET /v1/models/{m}`` (``{"name", "ready"}``, 503 while not ready) as KServe's model server
answers them (and its ``GET /v2/models``, the same list), which the kserve SDK's v1 client
reads (``is_server_live``, ``is_model_ready``). The management API keeps TorchServe's
``GET /v1/models/{m}`` (always 200); where both APIs share one listener (KServe's TorchServe
config) that one answers.

Each instance becomes one request to the model's queue (see ``encode_instance`` for the row the
handler gets); the batcher groups them like any other requests and the results come back
in order. No worker or handler change: a handler that answers ``/predictions`` answers this too.
Every instance is admitted before any is awaited; if one is refused (queue full, no worker), the
ones already queued are cancelled (the batcher skips them) and the call gets that one error.
More instances than the model's queue holds at all (``job_queue_size``, or their priority
level's ``maxQueueSize``) are a 413 at once.
The first failed instance's status and body are the response. A streaming handler's
instance is answered with its parts and final response joined, as TorchServe's client reads
the chunks, bounded by ``max_response_size``. The answer is bounded as one
response (``max_response_size``: 500 past it), as TorchServe answers a v1 call as one. A client
that disconnects while
its instances wait has every one cancelled (queued: never run) and is recorded 499, as on
``/predictions`` (disconnect.py); one that disconnects while its body is parsed (in steps,
the server serving others meanwhile) has none queued, 499 too. A body in a
``Content-Encoding`` is inflated first, bounded by ``max_request_size`` (gzip and deflate,
as ``/predictions`` and OIP infer take them; another coding is a 415), and each instance is
sent on uncoded. Torch-free.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import string
from collections.abc import Callable, Iterator
from re import Match
from typing import Any, Protocol
from urllib.parse import quote_plus

from torchbay.server.errors import BadRequest, HandlerFailed
from torchbay.server.http import cooperative_json
from torchbay.server.http.asgi import (
    Receive,
    Scope,
    Send,
    dumps,
    header,
    read_body,
    send_bytes,
    send_json,
)
from torchbay.server.http.disconnect import all_answers, unless_left
from torchbay.server.plane import (
    DataPlane,
    Exchange,
    Gathered,
    WireRequest,
    WireResponse,
    oip_body,
)


class Listener(Protocol):
    """What v1 predict needs of the inference listener that routes to it (server.http.inference
    implements it): its data plane, limits, key check, and how it builds a WireRequest."""

    plane: DataPlane
    max_request_size: int
    authorize: Callable[[Scope, str], None] | None

    def _wire_request(self, scope: Scope, body: bytes, protocol: str) -> WireRequest: ...


# The body is re-encoded here: its framing and its coding headers do not carry over.
_DROPPED_HEADERS = (b"content-type", b"content-length", b"transfer-encoding", b"content-encoding")
# An instance of strings goes as a form whose values the worker hands over as str, not as the
# bytearrays of a client's form (handlers/runtime/envelopes.INSTANCE_PARAM); any other as JSON,
# marked the same, so that a tensor the handler returns for it is answered as its values (one
# of the call's JSON predictions), not as the torch.save bytes of /predictions.
_INSTANCE_FORM = b"application/x-www-form-urlencoded; torchbay-row=instance"
# What quote_plus leaves as it is (letters, digits, "_.-~"), and base64's "+/=" it escapes.
_BASE64_FORM = (string.ascii_letters + string.digits + "_.-~+/=").encode()
_INSTANCE_JSON = b"application/json; torchbay-row=instance"


class KServeV1:
    """The inference listener's KServe v1 endpoints (named as ``route_table`` names them)."""

    def __init__(self, app: Listener) -> None:
        self.app = app

    async def kserve_v1(self, scope: Scope, receive: Receive, send: Send, match: Match) -> None:
        await predict(self.app, scope, receive, send, match["model_name"])

    async def kserve_v1_explain(
        self, scope: Scope, receive: Receive, send: Send, match: Match
    ) -> None:
        name = match["model_name"]
        await predict(self.app, scope, receive, send, name, explain=True)

    async def kserve_live(self, scope: Scope, receive: Receive, send: Send, match: Match) -> None:
        await send_json(send, 200, {"status": "alive"})

    async def kserve_models(self, scope: Scope, receive: Receive, send: Send, m: Match) -> None:
        if self.app.authorize is not None:
            self.app.authorize(scope, "inference")
        await send_json(send, 200, {"models": self.app.plane.model_names()})

    async def kserve_ready(self, scope: Scope, receive: Receive, send: Send, m: Match) -> None:
        if self.app.authorize is not None:
            self.app.authorize(scope, "inference")
        mv, ready = self.app.plane.model_ready(m["model_name"])
        await send_json(send, 200 if ready else 503, {"name": mv.name, "ready": ready})


async def parse_instances(body: bytes, keep: int) -> tuple[list[Any], int]:
    """The body's instances, as ``json.loads`` reads them, parsed in steps that let the event
    loop serve other requests meanwhile (cooperative_json; one ``json.loads`` of a 6 MB body of
    two million instances held the whole server for seconds), and how many there are. Only the
    first ``keep`` are kept: more than the model's queue holds are a 413 however many, decided
    by the first instance (its row, its priority) and the count."""
    try:
        data = await cooperative_json.loads(body, ("instances", max(1, keep)))
    except RecursionError:
        raise BadRequest("body is not valid JSON: nested too deep") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from exc
    instances = data.get("instances") if isinstance(data, dict) else None
    if not isinstance(instances, list) or not instances:
        raise BadRequest('KServe v1 body must be {"instances": [...]} with at least one instance')
    return instances, getattr(instances, "total", len(instances))


def _form(text: str) -> bytes:
    """``text`` as ``urlencode`` writes a form's name or value (``quote_plus``). A base64 image
    (letters, digits, ``+/=``: KServe's image instances) in three C replaces: quote_plus goes
    a character at a time in Python, 484 ms on the event loop for a 6 MB image, 16 ms so."""
    if text.isascii():
        data = text.encode()
        if not data.translate(None, _BASE64_FORM):
            return data.replace(b"+", b"%2B").replace(b"/", b"%2F").replace(b"=", b"%3D")
    return quote_plus(text).encode()


def encode_instance(instance: Any) -> tuple[bytes, bytes]:
    """One instance as a request body. An object of strings (``{"data": "<base64>"}``, KServe's
    image examples) goes form-encoded, so the handler's row IS the instance, as with
    TorchServe's kserve envelope; anything else goes as JSON (row ``{"body": instance}``)."""
    if (
        isinstance(instance, dict)
        and instance
        and all(isinstance(v, str) for v in instance.values())
    ):
        try:
            body = b"&".join(_form(k) + b"=" + _form(v) for k, v in instance.items())
        except UnicodeEncodeError:  # a JSON escape of half a UTF-16 pair ("\ud800")
            raise BadRequest(
                "an instance's text holds a lone surrogate (half of a UTF-16 pair), which is "
                "not text"
            ) from None
        return body, _INSTANCE_FORM
    return json.dumps(instance).encode(), _INSTANCE_JSON


def decode_prediction(response: WireResponse) -> Any:
    """A handler's answer to one instance: JSON when it is JSON, else text."""
    try:
        return json.loads(response.body)
    except (ValueError, UnicodeDecodeError):
        return response.body.decode("utf-8", "replace")


async def predict(
    app: Listener, scope: Scope, receive: Receive, send: Send, name: str, explain: bool = False
) -> None:
    """Answer one v1 predict (or, ``explain``, explain) call on model ``name``, recorded once by
    the plane. Explain sends each instance with TorchServe's ``explain: True`` header (what
    ``/explanations`` does) and answers ``{"explanations": [...]}``, as KServe's v1 protocol."""
    with app.plane.exchange(scope, name, None) as ex:
        if app.authorize is not None:
            app.authorize(scope, "inference")
        ex.resolve()  # 503 from the headers alone: the body is never read
        body = await read_body(scope, receive, app.max_request_size)
        encoding = header(scope, b"content-encoding")
        if encoding is not None:  # gzip or deflate, as the other inference routes; else 415
            body = oip_body.decoded(body, encoding.decode("latin-1"), app.max_request_size)
        assert ex.model is not None  # resolved
        parsed = await unless_left(scope, ex, parse_instances(body, ex.model.queue.capacity))
        if parsed is None:
            return  # the client left while its body was parsed: nothing queued, 499
        instances, count = parsed
        items = ex.admit_all(_wires(app, scope, instances, explain), count)
        key = "explanations" if explain else "predictions"
        ex.status = await _answer(scope, ex, items, send, key)


async def _answer(scope: Scope, ex: Exchange, items: list[Any], send: Send, key: str) -> int:
    """The call's answer, sent; its status. A client that disconnects while its instances wait
    (or stream) has them cancelled (never run when still queued) and nothing sent: 499."""
    limit = ex.model.settings.max_response_size if ex.model is not None else 0
    answers = [asyncio.ensure_future(_whole(ex, item, limit)) for item in items]
    results = await all_answers(scope, ex, answers)
    if results is None:
        return ex.status
    for result in results:
        if isinstance(result, BaseException):
            raise result  # TorchbayError (worker died, timeout): the app sends it
    failed = next((r for r in results if r.status >= 400), None)
    if failed is not None:
        await send_bytes(send, failed.status, failed.body, failed.content_type.encode("latin-1"))
        return failed.status
    _bounded(sum(len(r.body) for r in results), len(results), limit)
    body = dumps({key: [decode_prediction(r) for r in results]})
    _bounded(len(body), len(results), limit)
    await send_bytes(send, 200, body)
    return 200


async def _whole(ex: Exchange, item: Any, limit: int) -> WireResponse:
    """An instance's one answer: a streaming handler's parts and its final response joined
    (what TorchServe's client reads of its chunks), at most ``limit`` bytes (past it: 500);
    an error after the first part is the instance's answer. Before, only the final response
    was kept: a generator's answer was "" and every part was lost."""
    first = await item.future
    if not first.partial:
        return first
    size = Gathered(limit)
    bodies = [size.add(first.body)]
    async with contextlib.aclosing(ex.rest(item)) as rest:
        async for response in rest:
            if response.status >= 400:
                return response
            bodies.append(size.add(response.body))
    return WireResponse(first.status, b"".join(bodies), first.content_type)


def _bounded(size: int, count: int, limit: int) -> None:
    """The call's answer is bounded as one response is (TorchServe answers a v1 call as one):
    past ``max_response_size`` (0: none) in all, it is the 500 of a response too large, as an
    instance's own answer past it is; each instance's answer was bounded alone before."""
    if limit and size > limit:
        raise HandlerFailed(
            f"The model's responses to the {count} instances, {size} bytes in all, exceed "
            f"the server's max_response_size of {limit} bytes"
        )


def _wires(
    app: Listener, scope: Scope, instances: list[Any], explain: bool = False
) -> Iterator[WireRequest]:
    """One request per instance, made as ``admit_all`` takes it: past the queue's bound none
    is made (a body of a million instances made them all first: the event loop held for
    a minute and gigabytes of copied headers, to be refused 503 at the 101st)."""
    headers = [(k, v) for k, v in scope["headers"] if k not in _DROPPED_HEADERS]
    if explain:
        headers.append((b"explain", b"True"))
    for instance in instances:
        body, content_type = encode_instance(instance)
        one = {**scope, "headers": [*headers, (b"content-type", content_type)]}
        yield app._wire_request(one, body, "predict")
