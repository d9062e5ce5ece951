"""The bare-HTTP ceiling: a raw ASGI app (no framework) that reads the POST body and answers a
small JSON. Any path and method is answered 200, so readiness polls and the load use the same URL.

    python -m torchbay.benchmarks.ceilings.echo_asgi --port 8080   # or --port 0 --ready-file F
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from torchbay.benchmarks.ceilings import _serve

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_HEADERS = [(b"content-type", b"application/json")]


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """Answer ``{"ok":true,"bytes":N}`` with N the body length. The app has nothing to start or
    stop, so it is served with uvicorn's lifespan off and answers HTTP only."""
    if scope["type"] != "http":
        return
    size = 0
    more = True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    body = b'{"ok":true,"bytes":%d}' % size
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [*_HEADERS, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def main(argv: list[str] | None = None) -> int:
    return _serve.main(__doc__, argv, lambda args: app, lifespan="off")


if __name__ == "__main__":
    raise SystemExit(main())
