"""The ``busy`` record's handler (TorchServe's module-level ``handle``, so both servers run it):
a request ``{"started": path, "gate": path}`` creates the file ``started`` when its batch begins,
then waits (60 s at most) until the file ``gate`` exists, so a recorder holds a worker busy for
as long as it needs. Every request answers ``{"ok": true}``."""

import json
import os
import time


def _body(row):
    body = row.get("body", row.get("data"))
    if isinstance(body, (bytes, bytearray, str)):
        body = json.loads(body or "{}")
    return body if isinstance(body, dict) else {}


def handle(data, context):
    if data is None:
        return None
    for body in (_body(row) for row in data):
        if body.get("started"):
            open(body["started"], "w").close()
        deadline = time.monotonic() + 60
        while body.get("gate") and not os.path.exists(body["gate"]):
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
    return [{"ok": True} for _ in data]
