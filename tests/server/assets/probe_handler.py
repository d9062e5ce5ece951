"""A test handler that reports what the server did: batch size, pid, gpu id.

Each request is a JSON object; keys change what happens to it:
  {"sleep": s}   the batch sleeps max(s) seconds before answering (a slow or stuck model)
  {"until": path} the batch first waits (60 s at most) until the file ``path`` exists: a test
                 holds a worker busy for exactly as long as it needs
  {"bad": true}  this item fails with 400 (BadInput); the others still run
  {"crash": true} the worker process dies mid-batch (os._exit)
  {"deaf": true}  the worker ignores SIGTERM from then on (a handler that installed its own)
  {"echo": x}    returned as is; the handler also remembers every echo it ran
  {"ran": true}  returns the list of echoes this worker ran so far
The archive's TorchScript model really runs on every batch (one row per surviving item).
With ``PROBE_EXIT_LINES=n`` in its environment, a worker prints ``probe exit line 0..n-1`` at
its exit (an atexit hook: a handler's last words).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import time

import torch

from torchbay.handlers.base_handler import BaseHandler
from torchbay.handlers.errors import BadInput

RAN: list[object] = []


class ProbeHandler(BaseHandler):
    def initialize(self, context):
        super().initialize(context)
        if os.environ.get("PROBE_FAIL_LOAD"):
            raise RuntimeError("probe told to fail loading")
        self.gpu_id = context.system_properties.get("gpu_id")
        lines = int(os.environ.get("PROBE_EXIT_LINES", "0"))
        if lines:
            atexit.register(lambda: print("".join(f"probe exit line {i}\n" for i in range(lines))))

    def preprocess(self, data):
        def one(item):
            body = item.get("body") if isinstance(item, dict) else None
            if isinstance(body, (bytes, bytearray)):  # TorchServe's gRPC {"body": JSON bytes}
                try:
                    body = json.loads(body)
                except (ValueError, RecursionError):
                    body = None  # not JSON: the 400 below
            if not isinstance(body, dict):
                raise BadInput("probe wants a JSON object body")
            if body.get("bad"):
                raise BadInput("this item was marked bad")
            return body

        self.batch_in = len(data)
        self.bodies = self.map_items(data, one)
        return torch.zeros(len(self.bodies), 64)

    def inference(self, batch, *args, **kwargs):
        if any(b.get("crash") for b in self.bodies):
            os._exit(17)
        if any(b.get("deaf") for b in self.bodies):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for gate in (b["until"] for b in self.bodies if "until" in b):
            deadline = time.monotonic() + 60
            while not os.path.exists(gate) and time.monotonic() < deadline:
                time.sleep(0.01)
        delay = max((float(b.get("sleep", 0)) for b in self.bodies), default=0.0)
        if delay:
            time.sleep(delay)
        return super().inference(batch)

    def postprocess(self, output):
        results = []
        for body, row in zip(self.bodies, output, strict=True):
            if "echo" in body:
                RAN.append(body["echo"])
            result = {
                "pid": os.getpid(),
                "batch": len(self.bodies),
                "batch_in": self.batch_in,
                "gpu_id": self.gpu_id,
                "threads": torch.get_num_threads(),
                "echo": body.get("echo"),
                "logits": len(row),
            }
            if body.get("ran"):
                result["ran"] = list(RAN)
            results.append(result)
        return results
