"""Many models per host (``max_loaded_models``, server/serving/multiplex.py): 200 tiny models
behind a budget of 16 loaded, a Zipf-skewed request mix, against one served model.

    python results/multiplex/run.py [--models 200] [--budget 16] [--runs 3]

Each run starts two real servers (``torchbay serve`` processes, their own ports) over archives
built once, in a temporary folder, from one tiny scripted MLP (16 -> 32 -> 8):

1. *single*: one model; a closed loop of ``--concurrency`` connections for ``--seconds``: its
   p50 and p99.
2. *multiplexed*: ``--models`` archives (``load_models=all``, ``max_loaded_models=--budget``);
   the same closed loop, each request to model k of rank k with probability ~ 1/k^s
   (``--zipf``, 1.1), after one request to each of the 10 hottest at once (every model
   starts unloaded) and ``--warmup`` seconds of the same mix: the p99 of the requests to
   the 10 hottest models (ranks 1-10) against the single model's p99, the loads and evictions
   during the window, and the peak summed RSS of the server's workers (sampled every 0.25 s)
   against the budget (``--budget`` times one worker's RSS, from the single run). Then, with
   nothing else running, ``--cold`` requests one after another to unloaded models of the tail:
   the cold-start latency (an eviction, a worker spawned, the model loaded, the answer).

Workers start as the server's default ``worker_start`` says: forked from the worker template
today. The summed RSS then counts the template (one process more than the budget) and, in each
worker, the pages it shares with the template; RESULTS.md's "Many models per host" tables were
taken when workers were spawned (each its own interpreter and torch import).

Each run's figures go to ``results/multiplex/run-<n>.json``, the medians over runs to
``results/multiplex/summary.json`` with the command line. The client is the load generator
(``loadgen.py``): one process, raw HTTP/1.1 keep-alive connections, the Zipf mix drawn once per
run as the target's request variants.
"""

from __future__ import annotations

import argparse
import array
import bisect
import itertools
import json
import random
import shlex
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from torchbay.benchmarks import procstat, scrape
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.loadgen import LoadGenerator, LoadPlan, Target
from torchbay.benchmarks.loadplan import TIMEOUT
from torchbay.benchmarks.managed import ManagedServer
from torchbay.benchmarks.round2_overload import answers
from torchbay.benchmarks.stats import percentile

RESULTS = Path("results/multiplex")
BODY = json.dumps([round(0.01 * i, 2) for i in range(16)]).encode()
JSON = {"Content-Type": "application/json"}
HOT = 10  # "the hottest models": ranks 1..HOT
ZIPF_DRAWS = 20000  # one run's request mix, drawn once and cycled


def build_store(root: Path, count: int) -> Path:
    """``count`` archives m001..m<count> of one tiny scripted MLP (the ``tensor`` handler)."""
    import torch

    from torchbay.archiver.package import ArchiveOptions, package

    store = root / "store"
    store.mkdir()
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    weights = root / "mlp.pt"
    torch.jit.save(torch.jit.script(mlp.eval()), str(weights))
    for k in range(1, count + 1):
        options = ArchiveOptions(
            model_name=name(k),
            version="1.0",
            serialized_file=weights,
            handler="tensor",
            export_path=store,
        )
        package(options)
    return store


def name(rank: int) -> str:
    return f"m{rank:03d}"


def start_server(root: Path, store: Path, models: list[str], budget: int) -> ManagedServer:
    """``torchbay serve`` for ``models`` of the store on free ports, no token, no access log."""
    run_dir = Path(tempfile.mkdtemp(dir=root))
    props = {
        "max_loaded_models": str(budget),
        # With a budget every model starts unloaded (the warm-up loads the hot ones).
        "default_workers_per_model": "0" if budget else "1",
        "access_log": "false",
        "disable_system_metrics": "true",
    }
    config = run_dir / "config.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    server = ManagedServer.torchbay(
        store / f"{models[0]}.mar",
        run_dir,
        auth=False,
        models=tuple(f"{m}.mar" for m in models),
        extra_args=("--ts-config", str(config)),
    )
    server.start_timeout_s = 600
    server.start()
    return server


def series(server: ManagedServer, name: str) -> dict[str, float]:
    """One multiplexer series by model (``""`` for a server-wide one)."""
    endpoints = server.endpoints
    assert endpoints is not None and endpoints.metrics_port is not None
    text = scrape.fetch_metrics(endpoints.host, endpoints.metrics_port, timeout=60)
    samples = scrape.parse_snapshot(text).samples.items()
    return {dict(labels).get("model", ""): v for (n, labels), v in samples if n == name}


def p(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of latencies in seconds, in ms."""
    return percentile(values, q * 100) * 1000


def closed_loop(
    gen: LoadGenerator,
    port: int,
    models: list[str],
    concurrency: int,
    seconds: float | None,
    timeout: float = 120,
) -> list[tuple[str, int, float]]:
    """``concurrency`` connections of the load generator, each sending the next request once
    answered, to ``models`` in turn, for ``seconds`` (None: one request per model):
    (model, status, seconds) per answered request."""
    target = Target(
        "127.0.0.1",
        port,
        "",
        (BODY,),
        tuple(JSON.items()),
        paths=tuple(f"/predictions/{m}" for m in models),
    )
    plan = LoadPlan(
        target,
        concurrency=concurrency,
        duration_s=seconds,
        requests=None if seconds else len(models),
        timeout_s=timeout,
        timeline=True,
    )
    result = gen.run(plan)
    if result.statuses.get(TIMEOUT):
        raise BenchError(f"{result.statuses[TIMEOUT]} requests unanswered after {timeout} s")
    variants = array.array("I", result.variants)
    return [
        (models[v], int(a.status), a.latency)
        for v, a in zip(variants, answers(result.timeline), strict=True)
    ]


def zipf_mix(count: int, s: float, seed: int, draws: int = ZIPF_DRAWS) -> list[str]:
    """``draws`` model names, model k of rank k with probability ~ 1/k^s."""
    rng = random.Random(seed)
    cum = list(itertools.accumulate(1 / k**s for k in range(1, count + 1)))
    return [name(bisect.bisect(cum, rng.random() * cum[-1]) + 1) for _ in range(draws)]


class RssPeak(threading.Thread):
    """Samples the summed RSS of a server's workers every 0.25 s until stopped."""

    def __init__(self, server: ManagedServer) -> None:
        super().__init__(daemon=True)
        self.server, self.peak, self.peak_workers = server, 0.0, 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.25):
            memory = procstat.memory_snapshot(self.server.pid, with_pss=False)
            if memory.workers_rss_mb > self.peak:
                self.peak, self.peak_workers = memory.workers_rss_mb, memory.processes - 1


def run_single(
    gen: LoadGenerator, root: Path, store: Path, args: argparse.Namespace
) -> dict[str, Any]:
    server = start_server(root, store, [name(1)], budget=0)
    endpoints = server.endpoints
    assert endpoints is not None
    try:
        port = endpoints.inference_port
        closed_loop(gen, port, [name(1)], args.concurrency, 2.0)  # warm
        answered = closed_loop(gen, port, [name(1)], args.concurrency, args.seconds)
        rss = procstat.memory_snapshot(server.pid, with_pss=False).largest_child_rss_mb
    finally:
        server.stop()
    ok = [t for _, status, t in answered if status == 200]
    return {
        "requests": len(answered),
        "errors": len(answered) - len(ok),
        "p50_ms": p(ok, 0.50),
        "p99_ms": p(ok, 0.99),
        "worker_rss_mb": rss or None,
    }


def run_multiplexed(
    gen: LoadGenerator, root: Path, store: Path, args: argparse.Namespace, seed: int
) -> dict[str, Any]:
    models = [name(k) for k in range(1, args.models + 1)]
    server = start_server(root, store, models, budget=args.budget)
    endpoints = server.endpoints
    assert endpoints is not None
    sampler = RssPeak(server)
    sampler.start()
    try:
        port = endpoints.inference_port
        mix = zipf_mix(args.models, args.zipf, seed)
        # One request to each of the hottest at once: loads them, in parallel.
        first = closed_loop(gen, port, [name(k) for k in range(1, HOT + 1)], HOT, None, timeout=600)
        if refused := [(m, status) for m, status, _ in first if status != 200]:
            raise BenchError(f"first requests refused: {refused}")
        sent = len(closed_loop(gen, port, mix, args.concurrency, args.warmup)) % len(mix)
        mix = mix[sent:] + mix[:sent]  # the window goes on with the mix where warm-up left it
        loads0 = sum(series(server, "torchbay_model_loads_total").values())
        evictions0 = sum(series(server, "torchbay_model_evictions_total").values())
        answered = closed_loop(gen, port, mix, args.concurrency, args.seconds)
        loads = sum(series(server, "torchbay_model_loads_total").values()) - loads0
        evictions = sum(series(server, "torchbay_model_evictions_total").values()) - evictions0
        peak_loaded = series(server, "torchbay_loaded_models")[""]
        cold = _cold_starts(server, args)
    finally:
        sampler.done.set()
        sampler.join()
        server.stop()
    hot = {name(k) for k in range(1, HOT + 1)}
    ok = [(m, t) for m, status, t in answered if status == 200]
    hot_times = [t for m, t in ok if m in hot]
    return {
        "requests": len(answered),
        "errors": len(answered) - len(ok),
        "hot_share": len(hot_times) / max(1, len(ok)),
        "hot_p50_ms": p(hot_times, 0.50),
        "hot_p99_ms": p(hot_times, 0.99),
        "all_p99_ms": p([t for _, t in ok], 0.99),
        "loads_in_window": loads,
        "evictions_in_window": evictions,
        "loaded_models_at_end": peak_loaded,
        "cold_start_ms": cold,
        "peak_worker_rss_mb": sampler.peak,
        "peak_workers": sampler.peak_workers,
    }


def _cold_starts(server: ManagedServer, args: argparse.Namespace) -> list[float]:
    """Requests one after another to unloaded models of the tail (rank order, last first)."""
    assert server.endpoints is not None
    url = f"http://127.0.0.1:{server.endpoints.inference_port}/predictions"
    loaded = series(server, "torchbay_model_loaded")
    tail = [m for m in sorted(loaded, reverse=True) if loaded[m] == 0][: args.cold]
    times = []
    for model in tail:
        start = time.perf_counter()
        response = httpx.post(
            f"{url}/{model}",
            content=BODY,
            headers=JSON,
            timeout=300,
        )
        if response.status_code != 200:
            raise RuntimeError(f"cold start of {model}: {response.status_code} {response.text}")
        times.append((time.perf_counter() - start) * 1000)
    return times


def summarize(runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    def med(path: tuple[str, str]) -> float:
        values = [r[path[0]][path[1]] for r in runs if r[path[0]][path[1]] is not None]
        return statistics.median(values)

    single_p99, hot_p99 = med(("single", "p99_ms")), med(("multiplexed", "hot_p99_ms"))
    rss_one = med(("single", "worker_rss_mb"))
    cold = [statistics.median(r["multiplexed"]["cold_start_ms"]) for r in runs]
    return {
        "command": "python results/multiplex/run.py " + shlex.join(sys.argv[1:]),
        "runs": len(runs),
        "single_p99_ms": single_p99,
        "hot10_p99_ms": hot_p99,
        "hot10_p99_over_single": hot_p99 / single_p99,
        "cold_start_ms": statistics.median(cold),
        "peak_worker_rss_mb": med(("multiplexed", "peak_worker_rss_mb")),
        "rss_budget_mb": args.budget * rss_one,
        "one_worker_rss_mb": rss_one,
        "loads_in_window": med(("multiplexed", "loads_in_window")),
        "requests_in_window": med(("multiplexed", "requests")),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--cold", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the JSON files go")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="torchbay-multiplex-") as tmp, LoadGenerator(1) as gen:
        root = Path(tmp)
        store = build_store(root, args.models)
        for n in range(1, args.runs + 1):
            run = {
                "single": run_single(gen, root, store, args),
                "multiplexed": run_multiplexed(gen, root, store, args, seed=n),
            }
            (args.out / f"run-{n}.json").write_text(json.dumps(run, indent=2))
            print(json.dumps({"run": n, **run}), flush=True)
            runs.append(run)
    summary = summarize(runs, args)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
