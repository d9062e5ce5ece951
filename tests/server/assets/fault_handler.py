"""A test handler with a handler author's mistakes, one per request body key (JSON objects):

  {"raise": "KeyboardInterrupt"}  ``handle`` raises this BaseException by name (also
                                  "GeneratorExit", "BaseException", "SystemExit")
  {"stream_raise": name}          the request's answer is a generator that yields one part,
                                  then raises that BaseException
  {"metric": [name, value]}       ``context.metrics.add_counter(name, float(value))`` (as many
                                  times as "times" says, once if absent)
Every other request answers {"pid": the worker's pid}.
"""

from __future__ import annotations

import builtins
import os
from typing import Any

from torchbay.handlers.base_handler import BaseHandler


def _stream(name: str) -> Any:
    yield {"part": 1}
    raise getattr(builtins, name)()


class FaultHandler(BaseHandler):
    def handle(self, data: list[Any], context: Any) -> list[Any]:
        bodies = [row.get("body") if isinstance(row, dict) else None for row in data]
        bodies = [b if isinstance(b, dict) else {} for b in bodies]
        for body in bodies:
            if "raise" in body:
                raise getattr(builtins, body["raise"])()
            if "metric" in body:
                name, value = body["metric"]
                for _ in range(int(body.get("times", 1))):
                    context.metrics.add_counter(name, float(value))
        return [
            _stream(b["stream_raise"]) if "stream_raise" in b else {"pid": os.getpid()}
            for b in bodies
        ]
