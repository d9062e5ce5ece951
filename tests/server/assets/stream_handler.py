"""A streaming test handler (a module-level ``handle``), driven by each request's JSON body:

  {"parts": ["a", "b"], "gate": path, "then_raise": bool, "crash": bool}
      sends each part with TorchServe's send_intermediate_predict_response; after the first it
      waits for the file ``gate`` (the test creates it only after reading part 1), or with
      ``crash`` the worker process dies; returns "end", or raises ValueError after the parts
      when ``then_raise``.
  {"until_stopped": path, "gate": path, "size": n}
      sends parts (of ``n`` bytes when given) until send_intermediate_predict_response raises
      StreamCancelled (the client left), waiting for ``gate`` after the first; then writes the
      exception's type name to ``until_stopped`` and re-raises.
  {"yield": ["a", "b"], "gate": path, "fail_after": n, "pace": s, "batch": true, "closed": path}
      returns a generator per request: each item is a part (waits for ``gate`` after the first;
      raises after ``n`` items when given; sleeps ``s`` seconds before each item; with
      ``batch`` each item ends with "/<batch size>"; with ``closed``, yields "." every 5 ms
      after the items until it is closed, then writes "GeneratorExit" there). A batch of such
      requests streams them all.
  {"text_input": "x y"}
      the generate extension: yields each word (and its space) as a part.
  anything else: answered {"plain": true} without streaming.
Every wait polls with a bounded deadline.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from gates import DEADLINE_S, wait_open  # packed beside this file (tests/server/assets/gates.py)
from ts.protocol.otf_message_handler import send_intermediate_predict_response


def _parts(body: dict, context) -> str:
    for i, part in enumerate(body["parts"]):
        send_intermediate_predict_response(
            [part], context.request_ids, "Intermediate", 200, context
        )
        if i == 0 and body.get("crash"):
            os._exit(17)
        if i == 0:
            wait_open(body.get("gate"))
    if body.get("then_raise"):
        raise ValueError("the handler failed mid-stream")
    return "end"


def _note(path: str, text: str) -> None:
    """Write ``text`` to ``path`` whole: the test polls for the file, and a read between its
    creation and its write would be empty."""
    tmp = Path(path + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _until_stopped(body: dict, context) -> str:
    end = time.monotonic() + DEADLINE_S
    i = 0
    try:
        while time.monotonic() < end:
            part = "x" * body["size"] if "size" in body else f"p{i}"
            send_intermediate_predict_response([part], context.request_ids, "", 200, context)
            if i == 0:
                wait_open(body.get("gate"))
            i += 1
            time.sleep(0.005)
    except Exception as exc:
        _note(body["until_stopped"], type(exc).__name__)
        raise
    return "never stopped"


def _generator(body: dict, batch: int = 1):
    try:
        for i, item in enumerate(body["yield"]):
            if body.get("fail_after") == i:
                raise RuntimeError("the generator failed mid-stream")
            time.sleep(float(body.get("pace", 0)))
            yield f"{item}/{batch}" if body.get("batch") else item
            if i == 0:
                wait_open(body.get("gate"))
        end = time.monotonic() + DEADLINE_S
        while body.get("closed") and time.monotonic() < end:
            time.sleep(0.005)
            yield "."
    except GeneratorExit:
        if body.get("closed"):
            _note(body["closed"], "GeneratorExit")
        raise


def _words(text: str):
    words = text.split(" ")
    for i, word in enumerate(words):
        yield word + (" " if i < len(words) - 1 else "")


def _body(row: dict):
    """The request's JSON: the HTTP body, or TorchServe gRPC's ``data`` input (bytes)."""
    body = row.get("body", row.get("data"))
    if isinstance(body, (bytes, bytearray)):
        try:
            return json.loads(body)
        except ValueError:
            return body
    return body


def handle(data, context):
    if data is None:  # initialization
        return None
    bodies = [_body(row) for row in data]
    if all(isinstance(b, dict) and "yield" in b for b in bodies):
        return [_generator(b, len(data)) for b in bodies]
    body = bodies[0]
    if not isinstance(body, dict) or len(data) != 1:
        return [{"plain": True} for _ in data]
    if "parts" in body:
        return [_parts(body, context)]
    if "until_stopped" in body:
        return [_until_stopped(body, context)]
    if "text_input" in body:
        return [_words(body["text_input"])]
    return [{"plain": True}]
