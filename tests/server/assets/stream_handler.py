"""A streaming test handler (a module-level ``handle``), driven by each request's JSON body:

  {"parts": ["a", "b"], "gate": path, "then_raise": bool}
      sends each part with TorchServe's send_intermediate_predict_response; after the first it
      waits for the file ``gate`` (the test creates it only after reading part 1); returns
      "end", or raises ValueError after the parts when ``then_raise``.
  {"until_stopped": path, "gate": path}
      sends parts until send_intermediate_predict_response raises StreamCancelled (the client
      left), waiting for ``gate`` after the first; then writes the exception's type name to
      ``until_stopped`` and re-raises.
  {"yield": ["a", "b"], "gate": path, "fail_after": n}
      returns a generator per request: each item is a part (waits for ``gate`` after the first;
      raises after ``n`` items when given).
  {"text_input": "x y"}
      the generate extension: yields each word (and its space) as a part.
  anything else: answered {"plain": true} without streaming.
Every wait polls with a bounded deadline.
"""

from __future__ import annotations

import time
from pathlib import Path

from ts.protocol.otf_message_handler import send_intermediate_predict_response

DEADLINE_S = 60.0


def _wait(path: str | None) -> None:
    if not path:
        return
    end = time.monotonic() + DEADLINE_S
    while not Path(path).exists():
        if time.monotonic() > end:
            raise TimeoutError(f"gate {path} never opened")
        time.sleep(0.005)


def _parts(body: dict, context) -> str:
    for i, part in enumerate(body["parts"]):
        send_intermediate_predict_response(
            [part], context.request_ids, "Intermediate", 200, context
        )
        if i == 0:
            _wait(body.get("gate"))
    if body.get("then_raise"):
        raise ValueError("the handler failed mid-stream")
    return "end"


def _until_stopped(body: dict, context) -> str:
    end = time.monotonic() + DEADLINE_S
    i = 0
    try:
        while time.monotonic() < end:
            send_intermediate_predict_response([f"p{i}"], context.request_ids, "", 200, context)
            if i == 0:
                _wait(body.get("gate"))
            i += 1
            time.sleep(0.005)
    except Exception as exc:
        Path(body["until_stopped"]).write_text(type(exc).__name__)
        raise
    return "never stopped"


def _generator(body: dict):
    for i, item in enumerate(body["yield"]):
        if body.get("fail_after") == i:
            raise RuntimeError("the generator failed mid-stream")
        yield item
        if i == 0:
            _wait(body.get("gate"))


def _words(text: str):
    words = text.split(" ")
    for i, word in enumerate(words):
        yield word + (" " if i < len(words) - 1 else "")


def handle(data, context):
    if data is None:  # initialization
        return None
    body = data[0].get("body")
    if not isinstance(body, dict) or len(data) != 1:
        return [{"plain": True} for _ in data]
    if "parts" in body:
        return [_parts(body, context)]
    if "until_stopped" in body:
        return [_until_stopped(body, context)]
    if "yield" in body:
        return [_generator(body)]
    if "text_input" in body:
        return [_words(body["text_input"])]
    return [{"plain": True}]
