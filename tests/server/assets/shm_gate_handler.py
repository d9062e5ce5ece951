"""A test handler for shared memory (``supports_v2``: it gets each input's array as the worker
decoded it, without a copy of its own). A request's ``parameters`` may name a ``log`` file,
written when the handler starts on the request, and a ``gate`` file it then waits for (the test
creates it); only then does it read its first input, and it answers ``SUM`` (INT64 [1]), the sum
of that input's values. Meanwhile a test can change the client's shared-memory object under it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gates import wait_open  # packed beside this file (tests/server/assets/gates.py)

from torchbay.handlers.base_handler import BaseHandler


class ShmGateHandler(BaseHandler):
    supports_v2 = True

    def handle(self, data: list[Any], context: Any) -> list[Any]:
        return [self._sum(row["body"]) for row in data]

    def _sum(self, body: dict[str, Any]) -> dict[str, Any]:
        params = body.get("parameters") or {}
        if params.get("log"):
            Path(params["log"]).write_text("started")
        wait_open(params.get("gate"))
        total = int(np.asarray(body["inputs"][0]["array"]).astype(np.int64).sum())
        array = np.array([total], dtype=np.int64)
        return {"outputs": [{"name": "SUM", "datatype": "INT64", "shape": [1], "array": array}]}
