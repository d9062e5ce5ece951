"""A test handler with a handler author's mistakes, one per request body key (JSON objects):

  {"raise": "KeyboardInterrupt"}  ``handle`` raises this BaseException by name (also
                                  "GeneratorExit", "BaseException", "SystemExit")
  {"stream_raise": name}          the request's answer is a generator that yields one part,
                                  then raises that BaseException
  {"metric": [name, value]}       ``context.metrics.add_counter(name, float(value))`` (as many
                                  times as "times" says, once if absent); a third item: the
                                  dimensions
  {"late_parts": n}               a thread the handler leaves running sends n parts of 1 MiB
                                  with send_intermediate_predict_response after it returned
  {"big": n}                      the answer carries n more bytes
  {"headers": n}                  the answer gets n headers x-fault-<i> of 100 bytes each
Every other request answers {"pid": the worker's pid}; one with an ``x-fault-status`` request
header (an OIP request, its body the input's data) answers its data with that status.
"""

from __future__ import annotations

import builtins
import os
import threading
import time
from typing import Any

from torchbay.handlers.base_handler import BaseHandler
from torchbay.handlers.streaming import send_intermediate_predict_response


def _stream(name: str) -> Any:
    yield {"part": 1}
    raise getattr(builtins, name)()


def _late_parts(n: int, ids: dict[int, str], context: Any) -> None:
    time.sleep(0.2)  # the handler has returned
    for _ in range(n):
        try:
            send_intermediate_predict_response(["z" * (1 << 20)] * len(ids), ids, "", 200, context)
        except Exception:  # the run ended: what a handler's thread sees
            return


class FaultHandler(BaseHandler):
    def handle(self, data: list[Any], context: Any) -> list[Any]:
        bodies = [row.get("body") if isinstance(row, dict) else None for row in data]
        bodies = [b if isinstance(b, dict) else {} for b in bodies]
        status = [context.get_request_header(i, "x-fault-status") for i in range(len(data))]
        if any(status):
            for i, code in enumerate(status):
                context.set_response_status(int(code or 200), "", i)
            return [row.get("data") for row in data]
        for idx, body in enumerate(bodies):
            if "raise" in body:
                raise getattr(builtins, body["raise"])()
            if "metric" in body:
                name, value, *dims = body["metric"]
                for _ in range(int(body.get("times", 1))):
                    context.metrics.add_counter(name, float(value), None, (dims or [None])[0])
            for i in range(int(body.get("headers", 0))):
                context.set_response_header(idx, f"x-fault-{i}", "v" * 100)
            if "late_parts" in body:
                args = (int(body["late_parts"]), dict(context.request_ids), context)
                threading.Thread(target=_late_parts, args=args, daemon=True).start()
        return [
            _stream(b["stream_raise"])
            if "stream_raise" in b
            else {"pid": os.getpid(), "big": "x" * int(b.get("big", 0))}
            for b in bodies
        ]
