"""Load generator capacity, before issue 11 (hand-written HTTP/1.1 parser, commit b9c900f) and now
(httptools), side by side in one run: interleaved rounds against one bare ASGI echo server
(c=16, 256-byte POST, keep-alive, 1 s warm-up, 5 s measured), then the parsers alone.

    git archive b9c900f benchmarks | tar -x -C /tmp/gen-old
    mv /tmp/gen-old/benchmarks /tmp/gen-old/oldbench
    grep -rl torchbay.benchmarks /tmp/gen-old/oldbench \\
        | xargs sed -i 's/torchbay\\.benchmarks/oldbench/g'
    python results/loadgen/capacity.py /tmp/gen-old 6
"""

from __future__ import annotations

import importlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

from torchbay.benchmarks.managed import ManagedServer

WIRE = (
    b"HTTP/1.1 200 OK\r\ndate: Mon, 23 Nov 2026 15:20:00 GMT\r\nserver: uvicorn\r\n"
    b'content-type: application/json\r\ncontent-length: 23\r\n\r\n{"ok":true,"bytes":256}'
)


def load_rounds(rounds: int) -> None:
    echo = [sys.executable, "-m", "torchbay.benchmarks.echo_asgi"]
    with tempfile.TemporaryDirectory() as tmp, ManagedServer(echo, Path(tmp)) as endpoints:
        gens, runs = {}, {"old": [], "new": []}
        for name, pkg in (("old", "oldbench"), ("new", "torchbay.benchmarks")):
            lg = importlib.import_module(pkg + ".loadgen")
            headers = (("Content-Type", "application/octet-stream"),)
            target = lg.Target("127.0.0.1", endpoints.inference_port, "/e", (b"x" * 256,), headers)
            plan = lg.LoadPlan(target, "closed", 16, duration_s=5.0, warmup_s=1.0)
            gens[name] = (lg.LoadGenerator(1), plan)
        for r in range(rounds):
            for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
                gen, plan = gens[name]
                res = gen.run(plan)
                runs[name].append((res.req_per_s, res.generator_cpu_pct[0]))
                cpu = res.generator_cpu_pct[0]
                print(
                    f"round {r + 1} {name}: {res.req_per_s:,.0f} req/s, generator "
                    f"{cpu:.0f}% of a core, errors {res.errors}"
                )
        for gen, _ in gens.values():
            gen.close()
    for name, values in runs.items():
        rps = statistics.median(v[0] for v in values)
        cpu = statistics.median(v[1] for v in values)
        each = ", ".join(f"{v[0]:,.0f}" for v in values)
        print(
            f"{name}: median {rps:,.0f} req/s ({each}); generator CPU median {cpu:.0f}% "
            f"= {1e4 * cpu / rps:.1f} us per request"
        )


def parser_rounds(rounds: int, n: int = 200_000) -> None:
    parsers = {
        "old": importlib.import_module("oldbench.httpwire").ResponseParser,
        "new": importlib.import_module("torchbay.benchmarks.httpwire").ResponseParser,
    }
    for r in range(rounds):
        for name, cls in parsers.items():
            parser, start = cls(), time.process_time()
            for _ in range(n):
                parser.feed(WIRE)
            per = 1e6 * (time.process_time() - start) / n
            print(f"parser round {r + 1} {name}: {per:.2f} us CPU per response")


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])
    load_rounds(int(sys.argv[2]) if len(sys.argv) > 2 else 4)
    parser_rounds(3)
