"""The garbage collector's runs in the frontend (the server's main process) during a load.

    python results/ab/gc-refusals/gc_count.py PYTHON MODE

PYTHON: the ``python`` of the checkout to measure; MODE as in ab.py; 8 s measured after 2 s of
warm-up. Prints the answers and, per generation, the collections and the seconds they took."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from serve import plan, start, stop

from torchbay.benchmarks.loadgen import LoadGenerator, LoadPlan


def main() -> None:
    python, mode = sys.argv[1], sys.argv[2]
    out = Path(f"/tmp/gc-ab/gc-{mode}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {"PYTHONPATH": str(Path(__file__).parent), "TB_GC": str(out)}
    proc, ready, model = start(python, mode, Path(f"/tmp/gc-ab/gc-{mode}"), env)
    try:
        measured = plan(mode, ready["inference"], model, 8.0)
        with LoadGenerator(1) as gen:
            gen.run(LoadPlan(measured.target, "closed", concurrency=16, duration_s=2))
            os.kill(ready["pid"], signal.SIGUSR1)
            result = gen.run(measured)
            os.kill(ready["pid"], signal.SIGUSR2)
            time.sleep(1)
        counts = json.loads(out.read_text())
    finally:
        stop(proc)
    print(f"{result.statuses}; gc collections per generation {counts['n']}, seconds", end=" ")
    print([round(s, 3) for s in counts["s"]])


if __name__ == "__main__":
    main()
