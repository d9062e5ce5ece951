"""A/B of tiny c=16 b8 w1: frontend CPU per request, base (af58885) vs WT, alternated.
usage: ab.py ROUNDS DURATION [variants...]   (variants: base, new, prof, profbase)"""

import os
import signal
import statistics as st
import sys
import time
from pathlib import Path

import psutil

from torchbay.benchmarks import runner
from torchbay.benchmarks.loadgen import LoadGenerator, LoadPlan
from torchbay.benchmarks.runner import Ctx, make_system, target, warm_up
from torchbay.benchmarks.scenarios import Batching

BASE_PP = "/tmp/hot/base-pkg"


def env_for(v, r):
    os.environ.pop("TB_PROF", None)
    os.environ.pop("PYTHONPATH", None)
    if v == "base":
        os.environ["PYTHONPATH"] = BASE_PP
    elif v.startswith("prof"):
        os.environ["PYTHONPATH"] = "/tmp/hot/prof" + (":" + BASE_PP if v == "profbase" else "")
        os.environ["TB_PROF"] = f"/tmp/hot/{v}-{r}.pstats"


def one(ctx, gen, v, r, dur, conc, args):
    env_for(v, r)
    server = make_system(
        ctx, "torchbay", {"tiny": Batching(8, 5, 1)}, ctx.out_dir / "runs" / f"{v}-{r}", args=args
    )
    server.start()
    try:
        tgt = target(ctx, server, "tiny", "tiny")
        plan = LoadPlan(tgt, "closed", conc, duration_s=dur)
        warm_up(ctx, plan)
        p = psutil.Process(server.pid)
        kids = p.children(recursive=True)
        c0 = p.cpu_times()
        k0 = [k.cpu_times() for k in kids]
        if v.startswith("prof"):
            os.kill(server.pid, signal.SIGUSR1)
        result = gen.run(plan)
        c1 = p.cpu_times()
        k1 = [k.cpu_times() for k in kids]
        if v.startswith("prof"):
            os.kill(server.pid, signal.SIGUSR2)
            time.sleep(2)
    finally:
        server.stop()
    fe = c1.user + c1.system - c0.user - c0.system
    wk = sum(b.user + b.system - a.user - a.system for a, b in zip(k0, k1, strict=False))
    n = result.completed
    return {
        "req_s": result.req_per_s,
        "fe_us": fe / n * 1e6,
        "wk_us": wk / n * 1e6,
        "fe_cores": fe / dur,
    }


def main():
    rounds, dur = int(sys.argv[1]), float(sys.argv[2])
    variants = sys.argv[3:] or ["base", "new"]
    conc = int(os.environ.get("AB_C", "16"))
    args = tuple(os.environ.get("AB_ARGS", "").split())
    work = Path("/tmp/hot/work")
    work.mkdir(parents=True, exist_ok=True)
    assets = runner.archive_models(runner.prepare_models(work), work, sys.executable)
    res = {v: [] for v in variants}
    with LoadGenerator(1) as gen:
        ctx = Ctx(work, assets, gen, dur, 3.0, 1)
        for r in range(rounds):
            for v in variants:
                d = one(ctx, gen, v, r, dur, conc, args)
                res[v].append(d)
                print(v, r, {k: round(x, 1) for k, x in d.items()}, os.getloadavg()[0], flush=True)
    for v in variants:
        print(
            v,
            "median fe_us",
            round(st.median(d["fe_us"] for d in res[v]), 1),
            "req/s",
            round(st.median(d["req_s"] for d in res[v])),
            "wk_us",
            round(st.median(d["wk_us"] for d in res[v]), 1),
        )


if __name__ == "__main__":
    main()
