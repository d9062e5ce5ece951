"""tiny c=16 b8 w1 under load, py-spy of the frontend for DURATION s: spy.py DURATION OUT"""

import os
import subprocess
import sys
from pathlib import Path

from torchbay.benchmarks import runner
from torchbay.benchmarks.loadgen import LoadGenerator, LoadPlan
from torchbay.benchmarks.runner import Ctx, make_system, target, warm_up
from torchbay.benchmarks.scenarios import Batching


def main():
    dur, out = float(sys.argv[1]), sys.argv[2]
    work = Path("/tmp/ab/work")
    work.mkdir(parents=True, exist_ok=True)
    assets = runner.archive_models(runner.prepare_models(work), work, sys.executable)
    with LoadGenerator(1) as gen:
        ctx = Ctx(work, assets, gen, dur + 4, 3.0, 1)
        server = make_system(ctx, "torchbay", {"tiny": Batching(8, 5, 1)}, work / "runs" / "spy")
        server.start()
        try:
            plan = LoadPlan(target(ctx, server, "tiny", "tiny"), "closed", 16, duration_s=dur + 4)
            warm_up(ctx, plan)
            import time

            import psutil

            kids = psutil.Process(server.pid).children(recursive=True)
            [k.cpu_percent() for k in kids]
            time.sleep(1)
            pid = (
                max(kids, key=lambda k: k.cpu_percent()).pid
                if os.environ.get("SPY_WORKER")
                else server.pid
            )
            print("kids", [(k.pid, k.name()) for k in kids])
            cmd = os.environ.get("PROF_CMD")
            argv = (
                cmd.format(pid=pid, dur=int(dur), out=out).split()
                if cmd
                else [
                    "/tmp/spyvenv/bin/py-spy",
                    "record",
                    "-r",
                    "400",
                    "--nonblocking",
                    "-f",
                    "raw",
                    "--threads",
                    "-d",
                    str(int(dur)),
                    "-o",
                    out,
                    "-p",
                    str(pid),
                ]
            )
            spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            r = gen.run(plan)
            spy.wait()
            print("req/s", r.req_per_s)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
