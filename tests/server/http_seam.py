"""uvicorn's protocol with our limits (``http.limits.protocol_class``) over a transport that
records what the server did with the socket, the seam of the HTTP edge's own tests
(test_http_coalesce, test_pipelining)."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from torchbay.server.http.limits import HttpLimits, protocol_class


class RecordingTransport(asyncio.Transport):
    """What was written, whether it was closed, whether the protocol reads."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False
        self.reading = True
        self.open_after_response = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8080)}.get(name)

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def writelines(self, parts: Any) -> None:
        self.writes.append(b"".join(parts))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def connected(app: Any) -> tuple[Any, RecordingTransport]:
    """A connection of our HTTP protocol running ``app``, over a new RecordingTransport."""
    # log_config None and no log_level: uvicorn leaves the logging setup of other tests alone
    config = uvicorn.Config(
        app, http=protocol_class(HttpLimits()), lifespan="off", log_config=None, access_log=False
    )
    config.load()
    protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={})
    transport = RecordingTransport()
    protocol.connection_made(transport)
    return protocol, transport
