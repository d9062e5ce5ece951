"""The metrics listener's app: the registry's text, then TorchServe's Prometheus families
(observe.ts_families, as ``metrics_mode`` and ``metrics_config`` say), and the wrappers that count
every HTTP answer in TorchServe's Requests2XX/4XX/5XX.

prometheus_client writes a counter's samples with ``_total`` and sorts label names; TorchServe's
``Requests2XX`` is a counter without ``_total`` and its labels come in their declared order
(``model_name, model_version, hostname``; ``Level, Hostname``), so its families are written by
observe.ts_families. The listener always answers text format 0.0.4, uncompressed: TorchServe
serves no OpenMetrics, where ``Requests2XX`` could not be a counter. Torch-free.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from prometheus_client import make_asgi_app

if TYPE_CHECKING:
    from torchbay.server.observe.metrics import ServerMetrics

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
AtHeaders = Callable[[Scope], Any]  # as http.limits.AtHeaders (observe imports no http)


def ts_text(metrics: ServerMetrics, names: set[str] | None = None) -> str:
    """TorchServe's Prometheus families (those in ``names``, or all), in text format 0.0.4:
    none in ``log`` mode, the three ``ts_inference_*`` counters in ``legacy`` mode."""
    return metrics.ts.text(names)


def counting(app: ASGIApp, metrics: ServerMetrics) -> ASGIApp:
    """``app``, each HTTP answer counted in Requests2XX/4XX/5XX (TorchServe's sendHttpResponse
    counts every answer of its inference, management and metrics listeners)."""

    async def counted(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def send_counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                metrics.count_response(int(message["status"]))
            await send(message)

        await app(scope, receive, send_counted)

    return counted


def counting_answers(at_headers: AtHeaders, metrics: ServerMetrics) -> AtHeaders:
    """``at_headers`` (a listener's answer from a request's headers alone, written by the HTTP
    protocol instead of the app's), each answer counted as ``counting`` counts the app's."""

    def counted(scope: Scope) -> Any:
        answer = at_headers(scope)
        if answer is not None:
            metrics.count_response(answer[0])
        return answer

    return counted


def metrics_app(metrics: ServerMetrics) -> ASGIApp:
    """The registry's exposition followed by ``ts_text``; ``name[]`` filters both."""
    inner = make_asgi_app(metrics.registry)
    dropped = (b"accept", b"accept-encoding")

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await inner(scope, receive, send)
            return
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in dropped]
        scope = {**scope, "headers": headers}
        start: Message = {}
        chunks: list[bytes] = []

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await inner(scope, receive, capture)
        body = b"".join(chunks)
        if start.get("status") == 200 and scope.get("method") != "HEAD":
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            names = set(query["name[]"]) if "name[]" in query else None
            body += ts_text(metrics, names).encode()
        out = list(start.get("headers", []))
        if scope.get("method") != "HEAD":  # HEAD: the length GET would have, as computed inside
            out = [(k, v) for k, v in out if k.lower() != b"content-length"]
            out.append((b"content-length", str(len(body)).encode()))
        status = start.get("status", 500)
        await send({"type": "http.response.start", "status": status, "headers": out})
        await send({"type": "http.response.body", "body": body})

    return app
