"""The longest event-loop stall of a KServe v1 body's parse when its long container lies deeper
than 8 levels: cooperative_json before the stack of open containers (an old copy of the module,
given by path) against this checkout's, on uvloop. Before, each container past 8 levels was one
scanner call, so the long one held the loop as one ``json.loads`` does.

Run: ``git show 329e8ab:server/http/cooperative_json.py > /tmp/old.py; .venv/bin/python
results/ab/v1-deep-stall.py /tmp/old.py``. Numbers in v1-deep-stall.txt (best (worst) of 3).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import uvloop

from torchbay.server.http import cooperative_json


def _load(path: str) -> object:
    spec = importlib.util.spec_from_file_location("cooperative_json_old", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _deep(levels: int, inner: str, count: int) -> bytes:
    items = ",".join([inner] * count)
    return ('{"instances": ' + "[" * levels + items + "]" * levels + "}").encode()


SHAPES = {
    "12 deep, 1.5M floats": _deep(12, "0.5", 1_500_000),
    "12 deep, 2M x []": _deep(12, "[]", 2_000_000),
    "4 deep, 2M x [] (both in steps)": _deep(4, "[]", 2_000_000),
}


async def main(old: object) -> None:
    measure = _measure_fn()
    print(f"{'shape':34s} {'MB':>4s} | {'before: CPU ms':>17s} {'stall ms':>17s} | the same after")
    for name, body in SHAPES.items():
        before = [await measure(lambda b=body: old.loads(b)) for _ in range(3)]
        after = [await measure(lambda b=body: cooperative_json.loads(b)) for _ in range(3)]
        cells = [[c for c, _ in runs] for runs in (before, after)]
        stalls = [[s for _, s in runs] for runs in (before, after)]
        print(
            f"{name:34s} {len(body) / 1e6:4.1f} | {_spread(cells[0])} {_spread(stalls[0])} | "
            f"{_spread(cells[1])} {_spread(stalls[1])}"
        )


def _measure_fn():  # type: ignore[no-untyped-def]
    """v1-parse-stall.py's measure (a file name with dashes: loaded by path)."""
    spec = importlib.util.spec_from_file_location(
        "v1_parse_stall", Path(__file__).with_name("v1-parse-stall.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._measure


def _spread(values: list[float]) -> str:
    return f"{min(values) * 1e3:7.1f} ({max(values) * 1e3:7.1f})"


if __name__ == "__main__":
    uvloop.run(main(_load(sys.argv[1])))
