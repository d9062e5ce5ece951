"""start to first answer, tiny, base vs new alternated. usage: st.py N [variants]"""

import os
import statistics as st
import sys
from pathlib import Path

from torchbay.benchmarks import runner
from torchbay.benchmarks.runner import Ctx, make_system
from torchbay.benchmarks.scenarios import Batching

sys.path.insert(0, "/tmp/hot")
from ab import env_for


def main():
    n = int(sys.argv[1])
    variants = sys.argv[2:] or ["base", "new"]
    work = Path("/tmp/hot/work")
    assets = runner.archive_models(runner.prepare_models(work), work, sys.executable)
    ctx = Ctx(work, assets, None, 1, 0, 1)
    body = assets.body["tiny"].read_bytes()
    res = {v: [] for v in variants}
    for r in range(n):
        for v in variants:
            env_for(v, r)
            s = make_system(ctx, "torchbay", {"tiny": Batching()}, work / "runs" / f"start-{v}-{r}")
            s.start()
            try:
                res[v].append(s.first_answer("/predictions/tiny", body))
            finally:
                s.stop()
            import subprocess
            import time

            t0 = time.monotonic()
            subprocess.run([sys.executable, "-c", "import torch"], check=True)
            torch_s = time.monotonic() - t0
            res.setdefault("torch", []).append(torch_s)
            print(
                v,
                r,
                round(res[v][-1], 3),
                "import torch alone",
                round(torch_s, 3),
                os.getloadavg()[0],
                flush=True,
            )
    for v in [*variants, "torch"]:
        print(v, "median", round(st.median(res[v]), 3), [round(x, 3) for x in res[v]])


if __name__ == "__main__":
    main()
