"""A test handler whose load is held or fails on purpose (serving/multiplex.py's tests).

At load, the archive's model-config.yaml says what happens: ``loadStarted: path`` is created
first (a test knows the load is under way); ``loadGate: path`` waits (polling, bounded) until
that file exists; ``loadFailsOnceExists: path`` raises once that file exists (a worker that
loaded fails when restarted); ``loadFails: true`` raises (``loadFails: memory``: MemoryError,
as a load that runs out of memory). Each request is the JSON object
``{"id": str, "gate": path}`` (``gate`` optional), sent as TorchServe's body: the handler waits
for ``gate`` to exist (so a test can hold a model busy), then answers ``{"id", "pid"}``.
"""

from __future__ import annotations

import os
from pathlib import Path

from gates import json_body, wait_open  # packed beside this file (tests/server/assets/gates.py)


def handle(data, context):
    if data is None:  # initialization
        config = context.model_yaml_config or {}
        if config.get("loadStarted"):
            Path(config["loadStarted"]).touch()
        wait_open(config.get("loadGate"))
        if config.get("loadFailsOnceExists") and Path(config["loadFailsOnceExists"]).exists():
            raise RuntimeError("this model fails to load again on purpose")
        if config.get("loadFails") == "memory":
            raise MemoryError("this model runs out of memory on purpose")
        if config.get("loadFails"):
            raise RuntimeError("this model fails to load on purpose")
        return None
    bodies = [json_body(row) for row in data]
    for body in bodies:
        wait_open(body.get("gate"))
    return [{"id": body["id"], "pid": os.getpid()} for body in bodies]
