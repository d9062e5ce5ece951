"""What the gate test handlers share (gate_handler.py, load_gate_handler.py, stream_handler.py):
packed beside each of them into its archive (conftest.build_store), so a handler imports it by
name from its model folder, as TorchServe's handlers import their extra files.

A gate is a file the test creates when the handler may go on; every wait polls it with a
bounded deadline, so a test that never opens one fails instead of hanging the worker."""

from __future__ import annotations

import json
import time
from pathlib import Path

DEADLINE_S = 60.0


def wait_open(path: str | None) -> None:
    """Return once the file ``path`` exists (at once when no gate is named)."""
    if not path:
        return
    end = time.monotonic() + DEADLINE_S
    while not Path(path).exists():
        if time.monotonic() > end:
            raise TimeoutError(f"gate {path} never opened")
        time.sleep(0.005)


def json_body(row: dict) -> dict:
    """A request's JSON object: TorchServe's body or ``data`` input, decoded when it came as
    bytes or text."""
    body = row.get("body", row.get("data"))
    if isinstance(body, (bytes, bytearray, str)):
        body = json.loads(body)
    return body
