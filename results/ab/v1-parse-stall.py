"""How long a KServe v1 body's parse holds the event loop, and its CPU: one ``json.loads``
(before) against ``server/http/cooperative_json.loads`` (after), on the event loop the server
uses (uvloop), for 6-9 MB bodies of the shapes a v1 client sends or an abuser could.

The longest stall is the longest gap between the turns of a task that only yields
(``await asyncio.sleep(0)``) while the parse runs: what a /ping waits at worst. ``keep 100``:
the parse as ``kserve_v1.parse_instances`` calls it for a model whose queue holds 100 (the
instances past it counted, not kept). Each figure is the best and the worst of 3 runs.

Run: ``.venv/bin/python results/ab/v1-parse-stall.py``. Numbers in v1-parse-stall.txt.
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop

from torchbay.server.http import cooperative_json


def _body(instance: str, count: int) -> bytes:
    return ('{"instances": [' + ",".join([instance] * count) + "]}").encode()


SHAPES = {
    "2M x []": _body("[]", 2_000_000),
    "3M x 0": _body("0", 3_000_000),
    "300k x {data:[1,2,3]}": _body('{"data": [1, 2, 3]}', 300_000),
    "1 x [1.5M floats]": _body("[" + ",".join(["0.5"] * 1_500_000) + "]", 1),
    "1 x {data: 6MB base64}": _body('{"data": "' + "QUJD" * 1_500_000 + '"}', 1),
    "8 x 224x224x3 floats": _body(json.dumps([[[0.123, 0.456, 0.789]] * 224] * 224), 8),
}


async def _measure(parse: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """The parse's CPU seconds and the longest gap between a yielding task's turns."""
    gaps, done = [0.0], False

    async def turns() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = asyncio.ensure_future(turns())
    await asyncio.sleep(0)
    started = time.process_time()
    value = await parse()
    cpu = time.process_time() - started
    done = True
    await task
    del value
    gc.collect()
    return cpu, max(gaps)


async def _old(body: bytes) -> Any:
    return json.loads(body)


def _spread(values: list[float], scale: float) -> str:
    return f"{min(values) * scale:7.1f} ({max(values) * scale:7.1f})"


async def main() -> None:
    print(f"{'':29s} | {'json.loads (before)':35s} | cooperative_json.loads (after)")
    print(f"{'shape':24s} {'MB':>4s} | {'CPU ms':>17s} {'longest stall ms':>17s} | the same")
    runs = [(name, body, None) for name, body in SHAPES.items()]
    runs.append(("2M x [] keep 100", SHAPES["2M x []"], ("instances", 100)))
    for name, body, keep in runs:
        before = [await _measure(lambda b=body: _old(b)) for _ in range(3)]
        after = [
            await _measure(lambda b=body, k=keep: cooperative_json.loads(b, k)) for _ in range(3)
        ]
        print(
            f"{name:24s} {len(body) / 1e6:4.1f} | "
            f"{_spread([c for c, _ in before], 1e3)} {_spread([s for _, s in before], 1e3)} | "
            f"{_spread([c for c, _ in after], 1e3)} {_spread([s for _, s in after], 1e3)}"
        )


if __name__ == "__main__":
    uvloop.run(main())
