"""Shared command line for the ceiling servers: one uvicorn process, uvloop + httptools."""

from __future__ import annotations

import argparse
from typing import Any


def add_server_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)


def serve(app: Any, host: str, port: int) -> None:
    """Run ``app`` the way the baseline's ceilings ran: one process, no access log."""
    import uvicorn

    uvicorn.run(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )
