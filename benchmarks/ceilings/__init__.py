"""The ceiling measured beside torchbay in the same run: a bare ASGI echo (``echo_asgi``), served
as :func:`serve` serves an app, ready as ``torchbay serve`` is (the naive FastAPI server and the
in-process loop of the reference table ran up to commit 1adc89d)."""

from __future__ import annotations

import argparse
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path


def serve(parser: argparse.ArgumentParser, make_app: Callable, lifespan: str = "auto") -> int:
    """Serve ``make_app(args)`` (``parser``'s and the server flags) in one uvicorn process:
    uvloop, httptools, no access log; ``lifespan`` off for an app with nothing to start. ``--port
    0 --ready-file PATH`` binds a free port, then writes ``{"inference": port}`` to PATH, as
    ``torchbay serve`` does."""
    import uvicorn

    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port (see --ready-file)")
    parser.add_argument("--ready-file", type=Path, help="write {'inference': port} here")
    args = parser.parse_args()
    app = make_app(args)
    # SO_REUSEADDR set and listening: connections queue from here on, so the ready file is true.
    sock = socket.create_server((args.host, args.port), backlog=2048)
    if args.ready_file is not None:
        tmp = args.ready_file.with_name(args.ready_file.name + ".tmp")
        tmp.write_text(json.dumps({"inference": sock.getsockname()[1], "pid": os.getpid()}))
        tmp.replace(args.ready_file)
    http = {"loop": "uvloop", "http": "httptools", "access_log": False, "log_level": "warning"}
    uvicorn.Server(uvicorn.Config(app, lifespan=lifespan, **http)).run(sockets=[sock])
    return 0
