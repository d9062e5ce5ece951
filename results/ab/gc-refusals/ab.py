"""Frontend CPU per answer, an older checkout against this one, both servers measured AT THE SAME
TIME (each with its own load generator), so both see the same host; alternated start order.

    python results/ab/gc-refusals/ab.py OLD_PYTHON MODE ROUNDS

OLD_PYTHON: the ``python`` of a venv with the older checkout installed editable; MODE: refuse
(every request refused at the headers: a model with no worker), tiny (tiny, batch 8, 1 worker,
c=16) or over (cnn, 2 workers, 4x its capacity, queue-time bound 200 ms). 10 s per round."""

from __future__ import annotations

import statistics
import sys
import threading
from pathlib import Path

from serve import cpu_s, plan, start, stop

from torchbay.benchmarks.loadgen import LoadGenerator, LoadPlan


def one_round(pythons: dict[str, str], mode: str, r: int, gens: dict) -> dict[str, float]:
    """Both servers started and warmed, then loaded at once: {side: frontend us per answer}."""
    procs, plans, results, before = {}, {}, {}, {}
    sides = list(pythons) if r % 2 == 0 else list(pythons)[::-1]
    try:
        for side in sides:
            proc, ready, model = start(pythons[side], mode, Path(f"/tmp/gc-ab/{mode}-{side}-{r}"))
            procs[side] = (proc, ready["pid"])
            plans[side] = plan(mode, ready["inference"], model, 10.0)
            warm = LoadPlan(plans[side].target, "closed", concurrency=16, duration_s=2)
            gens[side].run(warm)
        before = {side: cpu_s(pid) for side, (_, pid) in procs.items()}
        threads = [
            threading.Thread(target=lambda s=s: results.update({s: gens[s].run(plans[s])}))
            for s in sides
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        used = {side: cpu_s(pid) - before[side] for side, (_, pid) in procs.items()}
    finally:
        for proc, _ in procs.values():
            stop(proc)
    for side in sides:
        res = results[side]
        print(f"r{r} {side}: {res.statuses} fe {1e6 * used[side] / res.completed:.0f} us/answer")
    return {side: 1e6 * used[side] / results[side].completed for side in sides}


def main() -> None:
    old_python, mode, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    pythons = {"old": old_python, "new": sys.executable}
    gens = {side: LoadGenerator(1) for side in pythons}
    try:
        rows = [one_round(pythons, mode, r, gens) for r in range(rounds)]
    finally:
        for gen in gens.values():
            gen.close()
    for side in pythons:
        values = [row[side] for row in rows]
        print(
            f"{side} median us/answer {statistics.median(values):.0f}", [round(v) for v in values]
        )
    ratios = [row["new"] / row["old"] for row in rows]
    print(
        "new/old per round",
        [round(x, 3) for x in ratios],
        f"median {statistics.median(ratios):.3f}",
    )


if __name__ == "__main__":
    main()
