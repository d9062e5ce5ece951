"""tiny c=16 b8 w1: frontend CPU per request by thread, for each variant (README.md) in turn;
usage: thr.py ROUNDS DURATION [VARIANT...]"""

import os
import statistics as st
import sys
from pathlib import Path

import psutil

from torchbay.benchmarks import runner
from torchbay.benchmarks.loadgen import LoadGenerator, LoadPlan
from torchbay.benchmarks.runner import Ctx, target, warm_up
from torchbay.benchmarks.scenarios import Batching


def threads(p):
    return {t.id: t.user_time + t.system_time for t in p.threads()}


def watched(server, gen, plan):
    """``plan`` run on ``server``: its load result, the frontend's CPU seconds per thread and the
    workers' CPU seconds over the run, and perf stat's instruction counts where the host has
    hardware counters (in /tmp/ab/pstat.txt)."""
    import signal
    import subprocess

    p = psutil.Process(server.pid)
    kids = p.children(recursive=True)
    cmd = ["perf", "stat", "-e", "instructions:u,instructions:k", "-x", ",", "-p", str(server.pid)]
    ps = subprocess.Popen([*cmd, "-o", "/tmp/ab/pstat.txt"])
    t0, k0 = threads(p), [k.cpu_times() for k in kids]
    result = gen.run(plan)
    ps.send_signal(signal.SIGINT)
    ps.wait()
    t1, k1 = threads(p), [k.cpu_times() for k in kids]
    per = {tid: t1[tid] - t0.get(tid, 0) for tid in t1}
    used = sum(b.user + b.system - a.user - a.system for a, b in zip(k0, k1, strict=False))
    return result, per, used


def one(ctx, gen, r, dur, conc, args, v="base"):
    os.environ["PYTHONPATH"] = "/tmp/ab/exp"
    os.environ["TB_EXP"] = "" if v == "base" else v
    served, where = {"tiny": Batching(8, 5, 1)}, ctx.out_dir / "runs" / f"t-{v}-{r}"
    with runner.serving(ctx, "torchbay", served, where, args=args) as server:
        plan = LoadPlan(target(ctx, server, "tiny", "tiny"), "closed", conc, duration_s=dur)
        warm_up(ctx, plan)
        result, seconds, workers = watched(server, gen, plan)
    n = result.completed
    ins = {}
    with open("/tmp/ab/pstat.txt") as pstat:
        for line in pstat:
            f = line.strip().split(",")
            if len(f) > 3 and f[0].isdigit():
                ins[f[2]] = int(f[0]) / n / 1000
    per = {tid: used / n * 1e6 for tid, used in seconds.items()}
    wk = workers / n * 1e6
    main = per.pop(server.pid, 0)
    others = sorted((v for v in per.values() if v > 0.5), reverse=True)
    print(
        f"{v:20} r{r} req/s {result.req_per_s:.0f} fe main {main:.1f} "
        f"others {[round(x, 1) for x in others]} sum {main + sum(others):.1f} "
        f"kinstr/req u {ins.get('instructions:u', 0):.1f} k {ins.get('instructions:k', 0):.1f} "
        f"wk {wk:.1f} load {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    return (
        main + sum(per.values()),
        result.req_per_s,
        ins.get("instructions:u", 0),
        ins.get("instructions:k", 0),
    )


def main():
    rounds, dur = int(sys.argv[1]), float(sys.argv[2])
    args = tuple(os.environ.get("AB_ARGS", "").split())
    work = Path("/tmp/ab/work")
    work.mkdir(parents=True, exist_ok=True)
    assets = runner.archive_models(runner.prepare_models(work), work, sys.executable)
    variants = sys.argv[3:] or ["base"]
    out = {v: [] for v in variants}
    with LoadGenerator(1) as gen:
        ctx = Ctx(work, assets, gen, dur, 3.0, 1)
        for r in range(rounds):
            for v in variants:
                out[v].append(one(ctx, gen, r, dur, 16, args, v))
    for v in variants:
        print(
            f"{v:20} median fe_us",
            round(st.median(x[0] for x in out[v]), 1),
            "req/s",
            round(st.median(x[1] for x in out[v])),
            "kinstr u",
            round(st.median(x[2] for x in out[v]), 1),
            "k",
            round(st.median(x[3] for x in out[v]), 1),
        )


if __name__ == "__main__":
    main()
