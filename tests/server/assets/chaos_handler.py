"""A test handler that misbehaves on request, for the supervision and chaos tests.

Each request is a JSON object; keys change what happens to it:
  {"leak_mb": n}          keep n MiB allocated (touched) for the worker's lifetime: a leak
                          (up to "leak_cap_mb" in all, when given, to bound a test's memory)
  {"sleep": s}            the batch sleeps max(s) seconds before answering
  {"status": code}        answer with this HTTP status (even an invalid one)
  {"header": [k, v]}      add this response header (even an invalid one)
  {"big": n}              the answer carries n extra bytes
  {"print_mb": n}         print n MiB to stdout first (lines of 1 KiB)
Every answer is {"pid": worker pid, "leaked_mb": MiB leaked so far[, "big": "x" * n]}. The
archive's TorchScript model is loaded (BaseHandler) and left alone.
"""

from __future__ import annotations

import os
import time

from torchbay.handlers.base_handler import BaseHandler

LEAKED: list[bytearray] = []


class ChaosHandler(BaseHandler):
    def handle(self, data, context):
        bodies = [item.get("body") if isinstance(item, dict) else None for item in data]
        bodies = [b if isinstance(b, dict) else {} for b in bodies]
        delay = max((float(b.get("sleep", 0)) for b in bodies), default=0.0)
        if delay:
            time.sleep(delay)
        results = []
        for body in bodies:
            line = "p" * 1023
            for _ in range(int(body.get("print_mb", 0)) * 1024):
                print(line, flush=False)
        for idx, body in enumerate(bodies):
            cap = int(body.get("leak_cap_mb", 1 << 20)) << 20
            if body.get("leak_mb") and sum(len(b) for b in LEAKED) < cap:
                LEAKED.append(bytearray(b"\x01") * (int(body["leak_mb"]) << 20))
            if "status" in body:
                context.set_response_status(int(body["status"]), "chaos", idx)
            if "header" in body:
                name, value = body["header"]
                context.set_response_header(idx, name, value)
            result = {"pid": os.getpid(), "leaked_mb": sum(len(b) for b in LEAKED) >> 20}
            if "big" in body:
                result["big"] = "x" * int(body["big"])
            results.append(result)
        return results
