"""A test handler: the built-in tensor handler, plus magic inputs that misbehave for one request.

A request is the tensor handler's JSON ``{"data": [...]}`` (or a v2 request, whose request-level
``parameters`` carry the flags); flags:
  "poison": true     inference raises RuntimeError for the whole batch it is in
  "nan": true        this request's output becomes [NaN, Infinity, -Infinity]
  "badheader": true  this request's response gets a header value with CR/LF in it
  "badstatus": true  this request's response status is set to 99999
Every successful output carries ``"seen"``: the batch sizes of every ``handle`` call this request
was part of, in order (the first is the batch the server sent; more mean it was bisected).
"""

from __future__ import annotations

import math
from typing import Any

from torchbay.handlers.tensor import TensorHandler

SEEN: dict[str, list[int]] = {}


def _flags(row: Any) -> dict[str, Any]:
    body = row.get("body") if isinstance(row, dict) else None
    if not isinstance(body, dict):
        return {}
    if row.get("protocol") == "v2":
        return body.get("parameters") or {}
    return body


class PoisonHandler(TensorHandler):
    def handle(self, data: list[Any], context: Any) -> list[Any]:
        self.ids = [context.get_request_id(i) for i in range(len(data))]
        for rid in self.ids:
            SEEN.setdefault(rid, []).append(len(data))
        self.flags = [_flags(row) for row in data]
        return super().handle(data, context)

    def inference(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        if any(self.flags[i].get("poison") for i in self.kept_indices):
            raise RuntimeError(
                "poisoned input\nTraceback (most recent call last):\n  File /tmp/x.py"
            )
        return super().inference(data, *args, **kwargs)

    def postprocess(self, data: list[Any]) -> list[Any]:
        out = super().postprocess(data)
        kept = [self.kept_indices[j] for j, item in enumerate(data) if item is not None]
        for idx, item in zip(kept, out, strict=True):
            flags, seen = self.flags[idx], SEEN[self.ids[idx]]
            if "outputs" in item:
                item["outputs"].append(
                    {"name": "seen", "shape": [len(seen)], "datatype": "INT64", "data": seen}
                )
            else:
                item["seen"] = seen
            if flags.get("nan"):
                item["output"] = [math.nan, math.inf, -math.inf]
            if flags.get("badheader"):
                self.context.set_response_header(idx, "x-bad", "a\r\nInjected: yes")
            if flags.get("badstatus"):
                self.context.set_response_status(99999, "weird", idx)
        return out
