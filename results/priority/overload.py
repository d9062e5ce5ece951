"""Mixed-priority overload: does the high level keep its latency while the low level is refused?

    .venv/bin/python results/priority/overload.py --runs 3 --out results/priority

One model holds its one worker ``--service-ms`` per request (batch size 1) behind
``maxQueueDelayMs`` (503 + Retry-After); its capacity is measured first, closed loop. Two open
loops (Poisson) offer ``--load`` x capacity, ``--high-share`` of it with ``X-Torchbay-Priority:
1``, the rest at 2; the baseline is the same model without ``priorityLevels`` and no header.
Latencies of the 200s, from each request's scheduled send. Each mode runs ``--runs`` times on a
fresh server; writes one JSON per run and ``summary.json`` / ``summary.md`` (medians).

``--queue-cost N`` measures instead the queue's own cost per request (N requests, eight ``put``
then one ``take``): the plain queue, two levels, and with ``--baseline-queue FILE`` (queue.py of
an earlier commit) that queue; five rounds, the best of each.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from torchbay.archiver.package import ArchiveOptions, package
from torchbay.benchmarks.loadgen import LoadGenerator, LoadPlan, LoadResult, Target
from torchbay.benchmarks.managed import ManagedServer
from torchbay.benchmarks.report import markdown_table
from torchbay.benchmarks.round2_overload import answers
from torchbay.benchmarks.stats import percentile

HANDLER = '''"""Holds its worker SERVICE_S per request: a model of known capacity."""
import os
import time

SERVICE_S = float(os.environ.get("PRIO_BENCH_SERVICE_S", "0.02"))


def handle(data, context):
    if data is None:
        return None
    time.sleep(SERVICE_S * len(data))
    return [{"ok": True} for _ in data]
'''
MODEL = "busy"


def build(root: Path, priorities: bool, bound_ms: float) -> Path:
    """The archive in its own store: one worker, batch size 1, the admission bound."""
    work = root / ("prio" if priorities else "plain")
    store = work / "store"
    store.mkdir(parents=True)
    handler, config = work / "busy_handler.py", work / "model-config.yaml"
    handler.write_text(HANDLER)
    levels = "priorityLevels: 2\ndefaultPriorityLevel: 2\n" if priorities else ""
    config.write_text(
        "minWorkers: 1\nmaxWorkers: 1\nbatchSize: 1\nmaxBatchDelay: 0\n"
        f"maxQueueDelayMs: {bound_ms:g}\njobQueueSize: 10000\n{levels}"
    )
    options = ArchiveOptions(
        model_name=MODEL, version="1.0", handler=str(handler), config_file=config, export_path=store
    )
    package(options)
    return store / f"{MODEL}.mar"


def summarize(result: LoadResult) -> dict[str, Any]:
    """One class of one run: what was offered, answered, refused, and the 200s' latency."""
    ok = [a.latency * 1000 for a in answers(result.timeline) if a.status == 200]
    refused = result.statuses.get("503", 0)
    return {
        "offered_per_s": result.offered_rate,
        "sent": result.sent,
        "ok": result.ok,
        "refused_503": refused,
        "refused_pct": 100 * refused / result.sent if result.sent else 0.0,
        "other": result.sent - result.ok - refused,
        "p50_ms": percentile(ok, 50),
        "p99_ms": percentile(ok, 99),
        "behind": result.behind,
    }


def calibrate(archive: Path, run_dir: Path, seconds: float) -> float:
    """The model's capacity on this host, requests per second: closed loop, two connections
    (the worker never idles between requests), on a fresh server without priorities."""
    with ManagedServer.torchbay(archive, run_dir, auth=False) as ends:
        target = Target(ends.host, ends.inference_port, f"/predictions/{MODEL}", (b"{}",))
        plan = LoadPlan(target, mode="closed", concurrency=2, duration_s=seconds, warmup_s=1)
        with LoadGenerator(1) as gen:
            return gen.run(plan).ok_per_s


def run_once(
    archive: Path, run_dir: Path, args: argparse.Namespace, priorities: bool, capacity: float
) -> dict:
    """One fresh server, both classes at once (``args.load`` x ``capacity`` in all); each
    class's summary."""
    rates = {"high": args.load * capacity * args.high_share}
    rates["low"] = args.load * capacity - rates["high"]
    levels = {"high": "1", "low": "2"}
    server = ManagedServer.torchbay(archive, run_dir, auth=False)
    with server as ends:
        server.first_answer(f"/predictions/{MODEL}", b"{}")

        def drive(name: str) -> LoadResult:
            headers = (("x-torchbay-priority", levels[name]),) if priorities else ()
            path = f"/predictions/{MODEL}"
            target = Target(ends.host, ends.inference_port, path, (b"{}",), headers)
            plan = LoadPlan(
                target,
                mode="open",
                rate=rates[name],
                arrival="poisson",
                duration_s=args.seconds,
                warmup_s=args.warmup,
                timeout_s=30,
                seed=1 if name == "high" else 2,
                timeline=True,
            )
            with LoadGenerator(1) as gen:
                return gen.run(plan)

        with ThreadPoolExecutor(len(rates)) as pool:  # both classes at once
            results = dict(zip(rates, pool.map(drive, rates), strict=True))
    return {name: summarize(result) for name, result in results.items()}


# The table's figures after mode and class: each the median over runs, in its format.
MEDIANS = {"offered_per_s": "{:.0f}", "ok": "{:.0f}", "refused_pct": "{:.1f}%"}
MEDIANS |= {"p50_ms": "{:.1f}", "p99_ms": "{:.1f}"}
COLUMNS = ("mode", "class", "offered/s", "200s", "refused 503", "p50 ms (200s)", "p99 ms (200s)")


def report(summary: dict[str, list[dict]], args: argparse.Namespace) -> str:
    """The Markdown table of the medians, one row per mode and class."""
    rows = []
    for mode, runs in summary.items():
        for cls in ("high", "low"):
            cells = [
                f.format(statistics.median(r[cls][k] for r in runs)) for k, f in MEDIANS.items()
            ]
            rows.append([mode, cls, *cells])
    head = (
        f"Capacity {args.capacity:.1f}/s measured; offered {args.load:g}x, "
        f"{args.high_share:.0%} at priority 1; maxQueueDelayMs {args.bound_ms:g}; "
        f"{args.seconds:g} s per run; medians of {args.runs} runs."
    )
    return f"{head}\n\n{markdown_table(COLUMNS, rows, '--:::::')}\n"


def _queue_ns(module: Any, n: int, levels: Any = None) -> float:
    """Nanoseconds per request through ``module.BatchQueue``: n requests, eight ``put`` then
    one ``take`` at a time."""

    async def once() -> float:
        loop = asyncio.get_running_loop()
        kwargs = {} if levels is None else {"levels": levels()}
        q = module.BatchQueue(batch_size=8, max_delay_s=0, capacity=n, **kwargs)
        items = [module.Pending(i, loop.create_future(), 0.0) for i in range(n)]
        started = time.perf_counter()
        for i in range(0, n, 8):  # a short queue, as in service: eight in, one batch out
            for item in items[i : i + 8]:
                q.put(item)
            await q.take()
        return (time.perf_counter() - started) / n * 1e9

    return min(asyncio.run(once()) for _ in range(3))


def queue_cost(n: int, baseline: Path | None, rounds: int = 5) -> dict[str, float]:
    """The queue's own cost per request (see the module docstring): each variant measured in
    turn, ``rounds`` times, the best of each kept (a loaded host only ever adds time)."""
    from torchbay.server.serving import queue
    from torchbay.server.serving.priority import LevelPolicy, Levels

    variants: dict[str, Callable[[], float]] = {}
    if baseline is not None:
        spec = importlib.util.spec_from_file_location("baseline_queue", baseline)
        assert spec is not None and spec.loader is not None
        old = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = old  # dataclasses look their module up while defining
        spec.loader.exec_module(old)
        variants["baseline plain queue"] = lambda: _queue_ns(old, n)
    variants["plain queue (no levels)"] = lambda: _queue_ns(queue, n)
    variants["two levels, all at one"] = lambda: _queue_ns(
        queue, n, lambda: Levels([LevelPolicy(), LevelPolicy()], 1)
    )
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(rounds):
        for name, measure in variants.items():
            best[name] = min(best[name], measure())
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--service-ms", type=float, default=20.0)
    parser.add_argument("--bound-ms", type=float, default=100.0, help="maxQueueDelayMs")
    parser.add_argument("--load", type=float, default=2.0, help="offered load / capacity")
    parser.add_argument("--high-share", type=float, default=0.2)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--calibrate", type=float, default=5.0, help="seconds of calibration")
    parser.add_argument("--out", type=Path, default=Path("results/priority"))
    parser.add_argument("--queue-cost", type=int, default=0, help="requests (0: the run)")
    parser.add_argument("--baseline-queue", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.queue_cost:
        for name, ns in queue_cost(args.queue_cost, args.baseline_queue).items():
            print(f"{name}: {ns:.0f} ns per request")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    # the service time reaches the worker through the server's environment
    os.environ["PRIO_BENCH_SERVICE_S"] = str(args.service_ms / 1000)
    summary: dict[str, list[dict]] = {"priorities": [], "no priorities": []}
    with tempfile.TemporaryDirectory(prefix="prio-bench-") as tmp:
        root = Path(tmp)
        archives = {mode: build(root, mode == "priorities", args.bound_ms) for mode in summary}
        capacity = calibrate(archives["no priorities"], root / "calibrate", args.calibrate)
        print(f"capacity {capacity:.1f} requests/s")
        args.capacity = capacity
        for i in range(args.runs):
            for mode, archive in archives.items():
                run_dir = root / f"run-{mode[:2]}-{i}"
                run = run_once(archive, run_dir, args, mode == "priorities", capacity)
                summary[mode].append(run)
                name = f"{mode.replace(' ', '_')}-{i + 1}.json"
                (args.out / name).write_text(json.dumps(run, indent=2) + "\n")
                print(mode, i + 1, json.dumps(run))
    settings = {**{k: str(v) for k, v in vars(args).items()}, "capacity_per_s": capacity}
    (args.out / "summary.json").write_text(json.dumps({"settings": settings, **summary}, indent=2))
    table = report(summary, args)
    (args.out / "summary.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
