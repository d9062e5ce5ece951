"""The bare-HTTP ceiling measured beside torchbay in the same run: a raw ASGI app (no framework)
that reads the POST body and answers ``{"ok":true,"bytes":N}`` to any path and method, served by
one uvicorn process as ``torchbay serve`` is served (uvloop, httptools, no access log) and ready
as it is: ``python -m torchbay.benchmarks.echo_asgi --port 0 --ready-file F`` binds a free port,
then writes ``{"inference": port}`` to F. (The naive FastAPI server and the in-process loop of the
reference table ran up to commit 1adc89d.)"""

from __future__ import annotations

import argparse
import json
import os
import socket
from pathlib import Path
from typing import Any


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


def main() -> int:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port (see --ready-file)")
    parser.add_argument("--ready-file", type=Path, help="write {'inference': port} here")
    args = parser.parse_args()
    # SO_REUSEADDR set and listening: connections queue from here on, so the ready file is true.
    sock = socket.create_server((args.host, args.port), backlog=2048)
    if args.ready_file is not None:
        tmp = args.ready_file.with_name(args.ready_file.name + ".tmp")
        tmp.write_text(json.dumps({"inference": sock.getsockname()[1], "pid": os.getpid()}))
        tmp.replace(args.ready_file)
    http = {"loop": "uvloop", "http": "httptools", "access_log": False, "log_level": "warning"}
    uvicorn.Server(uvicorn.Config(app, lifespan="off", **http)).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
