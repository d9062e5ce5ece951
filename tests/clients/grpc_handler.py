"""A function handler for the gRPC tests: each request is a JSON object, in the HTTP body
(``{"body": {...}}``) or in a gRPC ``input`` entry (``{"data": b"{...}", ...}``); it answers
what the handler saw and did:

  {"sleep": s}    the batch sleeps max(s) seconds first
  {"echo": x}     returned, and remembered in RAN (the echoes this worker ran, in order)
  {"ran": true}   the answer also carries RAN
  {"bad": true}   BadInput (400) for the batch it is in
  {"boom": true}  a RuntimeError whose text names a path (a handler bug: 500)

Every answer has ``batch`` (the batch size it ran in) and ``keys`` (the row's keys).
"""

from __future__ import annotations

import json
import time

from torchbay.handlers.errors import BadInput

RAN: list[object] = []


def _item(row: dict) -> dict:
    value = row.get("data", row.get("body"))
    if isinstance(value, bytes | bytearray):
        value = json.loads(value)
    if not isinstance(value, dict):
        raise BadInput("the test handler wants a JSON object")
    return value


def handle(data, context):
    if data is None:
        return None
    items = [_item(row) for row in data]
    if any(item.get("bad") for item in items):
        raise BadInput("this item was marked bad")
    if any(item.get("boom") for item in items):
        raise RuntimeError("exploded reading /secret/path/weights.pt")
    delay = max((float(item.get("sleep", 0)) for item in items), default=0.0)
    if delay:
        time.sleep(delay)
    out = []
    for row, item in zip(data, items, strict=True):
        if "echo" in item:
            RAN.append(item["echo"])
        answer = {"batch": len(data), "echo": item.get("echo"), "keys": sorted(row)}
        if item.get("ran"):
            answer["ran"] = list(RAN)
        out.append(answer)
    return out
