"""The handler of Triton's ``repeat_int32`` example model: a decoupled model that answers one
request with one response per element of its input (Triton's ``repeat`` backend example,
``src/backends/backend/examples/repeat.cc``).

Inputs ``IN`` (INT32 [n]), ``DELAY`` (UINT32 [n]) and ``WAIT`` (UINT32 [1]); each response
carries ``OUT`` (INT32 [1], ``IN[i]``) and ``IDX`` (UINT32 [1], ``i``). Triton's model sleeps
``DELAY[i]`` ms before response ``i`` and ``WAIT`` ms before releasing the request, to show
responses arriving over time; here the delays are read but not slept (the example programs send
a second each, and check only the values and their order), so the responses come as fast as the
stream carries them. Returning a generator is how a torchbay handler streams: each item it yields
is one response on a gRPC ``ModelStreamInfer`` stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from torchbay.handlers.base_handler import BaseHandler
from torchbay.handlers.errors import BadInput


class RepeatHandler(BaseHandler):
    supports_v2 = True

    def handle(self, data: list[Any], context: Any) -> list[Any]:
        return [self._responses(row) for row in data]

    def _responses(self, row: Any) -> Iterator[dict[str, Any]]:
        if not isinstance(row, dict) or row.get("protocol") != "v2":
            raise BadInput("this model answers the Open Inference Protocol (/v2/models/...)")
        inputs = {t["name"]: t["array"] for t in row["body"]["inputs"]}
        if "IN" not in inputs:
            raise BadInput("input 'IN' is required")
        values = np.asarray(inputs["IN"], dtype=np.int32).ravel()
        return (
            {
                "outputs": [
                    {"name": "OUT", "datatype": "INT32", "shape": [1], "array": values[i : i + 1]},
                    {
                        "name": "IDX",
                        "datatype": "UINT32",
                        "shape": [1],
                        "array": np.array([i], dtype=np.uint32),
                    },
                ]
            }
            for i in range(len(values))
        )
