"""The bare-HTTP ceiling: a raw ASGI app (no framework) that reads the POST body and answers
``{"ok":true,"bytes":N}`` to any path and method (readiness polls and the load use one URL):
``python -m torchbay.benchmarks.ceilings.echo_asgi --port 0 --ready-file F``."""

from __future__ import annotations

import argparse
from typing import Any

from torchbay.benchmarks.ceilings import serve


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The app has nothing to start or stop: it is served with uvicorn's lifespan off."""
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    body = b'{"ok":true,"bytes":%d}' % size
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


if __name__ == "__main__":
    raise SystemExit(serve(argparse.ArgumentParser(description=__doc__), lambda args: app, "off"))
