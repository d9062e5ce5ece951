"""tiny c=16 b8 w1: frontend CPU per request by thread; usage: thr.py ROUNDS DURATION"""
import os, sys, statistics as st
from pathlib import Path
import psutil
from torchbay.benchmarks import runner
from torchbay.benchmarks.loadgen import LoadGenerator, LoadPlan
from torchbay.benchmarks.runner import Ctx, make_system, target, warm_up
from torchbay.benchmarks.scenarios import Batching

def threads(p):
    return {t.id: t.user_time + t.system_time for t in p.threads()}

def one(ctx, gen, r, dur, conc, args, v="base"):
    os.environ["PYTHONPATH"] = "/tmp/ab/exp"; os.environ["TB_EXP"] = "" if v == "base" else v
    server = make_system(ctx, "torchbay", {"tiny": Batching(8, 5, 1)}, ctx.out_dir / "runs" / f"t-{v}-{r}", args=args)
    server.start()
    try:
        tgt = target(ctx, server, "tiny", "tiny")
        plan = LoadPlan(tgt, "closed", conc, duration_s=dur)
        warm_up(ctx, plan)
        p = psutil.Process(server.pid)
        kids = p.children(recursive=True)
        import subprocess, signal
        ps = subprocess.Popen(["perf", "stat", "-e", "instructions:u,instructions:k", "-x", ",", "-p", str(server.pid), "-o", "/tmp/ab/pstat.txt"])
        t0 = threads(p); k0 = [k.cpu_times() for k in kids]
        result = gen.run(plan)
        ps.send_signal(signal.SIGINT); ps.wait()
        t1 = threads(p); k1 = [k.cpu_times() for k in kids]
    finally:
        server.stop()
    n = result.completed
    ins = {}
    for line in open("/tmp/ab/pstat.txt"):
        f = line.strip().split(",")
        if len(f) > 3 and f[0].isdigit():
            ins[f[2]] = int(f[0]) / n / 1000
    per = {tid: (t1[tid] - t0.get(tid, 0)) / n * 1e6 for tid in t1}
    wk = sum(b.user + b.system - a.user - a.system for a, b in zip(k0, k1)) / n * 1e6
    main = per.pop(server.pid, 0)
    others = sorted((v for v in per.values() if v > 0.5), reverse=True)
    print(f"{v:20} r{r} req/s {result.req_per_s:.0f} fe main {main:.1f} others {[round(x,1) for x in others]} sum {main+sum(others):.1f} kinstr/req u {ins.get('instructions:u',0):.1f} k {ins.get('instructions:k',0):.1f} wk {wk:.1f} load {os.getloadavg()[0]:.2f}", flush=True)
    return main + sum(per.values()), result.req_per_s, ins.get("instructions:u", 0), ins.get("instructions:k", 0)

def main():
    rounds, dur = int(sys.argv[1]), float(sys.argv[2])
    args = tuple(os.environ.get("AB_ARGS", "").split())
    work = Path("/tmp/ab/work"); work.mkdir(parents=True, exist_ok=True)
    assets = runner.archive_models(runner.prepare_models(work), work, sys.executable)
    variants = sys.argv[3:] or ["base"]
    out = {v: [] for v in variants}
    with LoadGenerator(1) as gen:
        ctx = Ctx(work, assets, gen, dur, 3.0, 1)
        for r in range(rounds):
            for v in variants:
                out[v].append(one(ctx, gen, r, dur, 16, args, v))
    for v in variants:
        print(f"{v:20} median fe_us", round(st.median(x[0] for x in out[v]), 1), "req/s", round(st.median(x[1] for x in out[v])), "kinstr u", round(st.median(x[2] for x in out[v]),1), "k", round(st.median(x[3] for x in out[v]),1))

if __name__ == "__main__":
    main()
