"""Concurrent A/B: base and new servers measured at the same time (same host conditions),
each with its own load generator; tiny c=16 b8 w1. usage: abc.py ROUNDS DURATION"""

import os
import statistics as st
import sys
import threading
from pathlib import Path

import psutil

from torchbay.benchmarks import runner
from torchbay.benchmarks.loadgen import LoadGenerator, LoadPlan
from torchbay.benchmarks.runner import Ctx, make_system, target, warm_up
from torchbay.benchmarks.scenarios import Batching

sys.path.insert(0, "/tmp/hot")
from ab import env_for


def cpu(p):
    t = p.cpu_times()
    return t.user + t.system


VARIANTS = ["base", "new"]


def one_round(work, assets, gens, r, dur, conc):
    """Both servers started, warmed, then loaded at once: {variant: {req_s, fe_us}}."""
    servers, plans = {}, {}
    order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
    for v in order:
        env_for(v, r)
        ctx = Ctx(work, assets, gens[v], dur, 3.0, 1)
        s = make_system(ctx, "torchbay", {"tiny": Batching(8, 5, 1)}, work / "runs" / f"c-{v}-{r}")
        s.start()
        servers[v] = s
        plans[v] = LoadPlan(target(ctx, s, "tiny", "tiny"), "closed", conc, duration_s=dur)
    try:
        for v in VARIANTS:
            warm_up(Ctx(work, assets, gens[v], dur, 2.0, 1), plans[v])
        procs = {v: psutil.Process(servers[v].pid) for v in VARIANTS}
        c0 = {v: cpu(procs[v]) for v in VARIANTS}
        results = {}
        threads = [
            threading.Thread(target=lambda v=v: results.__setitem__(v, gens[v].run(plans[v])))
            for v in VARIANTS
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        c1 = {v: cpu(procs[v]) for v in VARIANTS}
    finally:
        for s in servers.values():
            s.stop()
    return {
        v: {
            "req_s": results[v].req_per_s,
            "fe_us": (c1[v] - c0[v]) / results[v].completed * 1e6,
        }
        for v in VARIANTS
    }


def main():
    rounds, dur = int(sys.argv[1]), float(sys.argv[2])
    conc = int(os.environ.get("AB_C", "16"))
    work = Path("/tmp/hot/work")
    assets = runner.archive_models(runner.prepare_models(work), work, sys.executable)
    res = {v: [] for v in VARIANTS}
    with LoadGenerator(1) as g1, LoadGenerator(1) as g2:
        gens = {"base": g1, "new": g2}
        for r in range(rounds):
            for v, d in one_round(work, assets, gens, r, dur, conc).items():
                res[v].append(d)
                load = round(os.getloadavg()[0], 1)
                print(v, r, {k: round(x, 1) for k, x in d.items()}, load, flush=True)
    for v in VARIANTS:
        print(
            v,
            "median fe_us",
            round(st.median(d["fe_us"] for d in res[v]), 1),
            "all",
            [round(d["fe_us"], 1) for d in res[v]],
            "req/s",
            round(st.median(d["req_s"] for d in res[v])),
        )
    print(
        "ratio new/base per round",
        [round(n["fe_us"] / b["fe_us"], 3) for b, n in zip(res["base"], res["new"], strict=False)],
    )


if __name__ == "__main__":
    main()
