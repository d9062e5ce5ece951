"""A test handler whose load is held or fails on purpose (serving/multiplex.py's tests).

At load, the archive's model-config.yaml says what happens: ``loadGate: path`` waits (polling,
bounded) until that file exists; ``loadFails: true`` raises (``loadFails: memory``: MemoryError,
as a load that runs out of memory). Each request is the JSON object
``{"id": str, "gate": path}`` (``gate`` optional), sent as TorchServe's body: the handler waits
for ``gate`` to exist (so a test can hold a model busy), then answers ``{"id", "pid"}``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

DEADLINE_S = 60.0


def _wait(path: str | None) -> None:
    if not path:
        return
    end = time.monotonic() + DEADLINE_S
    while not Path(path).exists():
        if time.monotonic() > end:
            raise TimeoutError(f"gate {path} never opened")
        time.sleep(0.005)


def handle(data, context):
    if data is None:  # initialization
        config = context.model_yaml_config or {}
        _wait(config.get("loadGate"))
        if config.get("loadFails") == "memory":
            raise MemoryError("this model runs out of memory on purpose")
        if config.get("loadFails"):
            raise RuntimeError("this model fails to load on purpose")
        return None
    bodies = [row.get("body", row.get("data")) for row in data]
    bodies = [json.loads(b) if isinstance(b, (bytes, bytearray, str)) else b for b in bodies]
    for body in bodies:
        _wait(body.get("gate"))
    return [{"id": body["id"], "pid": os.getpid()} for body in bodies]
