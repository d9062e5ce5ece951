"""Shared command line for the ceiling servers: one uvicorn process, uvloop + httptools.

``--port 0 --ready-file PATH`` binds a free port, then writes ``{"inference": port}`` to PATH (as
``torchbay serve --ready-file`` does), so the harness starts every server under test one way.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from pathlib import Path
from typing import Any


def add_server_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port (see --ready-file)")
    parser.add_argument("--ready-file", type=Path, help="write {'inference': port} here")


def serve(
    app: Any, host: str, port: int, ready_file: Path | None = None, lifespan: str = "auto"
) -> None:
    """Run ``app`` the way the baseline's ceilings ran: one process, no access log
    (``lifespan``: uvicorn's setting; "off" for an app with nothing to start)."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)  # connections queue from here on, so the ready file can be written now
    if ready_file is not None:
        tmp = ready_file.with_name(ready_file.name + ".tmp")
        tmp.write_text(json.dumps({"inference": sock.getsockname()[1], "pid": os.getpid()}))
        tmp.replace(ready_file)
    config = uvicorn.Config(
        app,
        loop="uvloop",
        http="httptools",
        lifespan=lifespan,
        access_log=False,
        log_level="warning",
    )
    uvicorn.Server(config).run(sockets=[sock])
