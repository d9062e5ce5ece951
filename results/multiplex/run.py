"""Many models per host (``max_loaded_models``): 200 tiny models behind a budget of 16 loaded, a
Zipf-skewed request mix, against one served model (RESULTS.md "Many models per host").

    .venv/bin/python results/multiplex/run.py [--models 200] [--budget 16] [--runs 3] [--cold 5]

Each run starts two ``torchbay serve`` (``ManagedServer``) over one store of archives of a tiny
scripted MLP: *single* serves one model under a closed loop of ``--concurrency`` connections;
*multiplexed* serves ``--models`` under the same loop, model k drawn with probability ~ 1/k^s,
after one request to each of the 10 hottest and ``--warmup`` seconds of the mix. It reports the
hot ten's p99 against the single model's, loads and evictions in the window, the peak summed RSS
of the workers (sampled every 0.25 s; with forked workers it counts the template and the pages
shared with it, unlike RESULTS.md's tables, taken with spawned workers), then ``--cold``
requests to unloaded models of the tail one after another: the cold start. Writes
``run-<n>.json`` and ``summary.json`` into ``--out``.
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

from torchbay.benchmarks import procstat, scrape, stats
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.loadgen import LoadGenerator, LoadPlan, Target
from torchbay.benchmarks.loadplan import TIMEOUT
from torchbay.benchmarks.managed import ManagedServer
from torchbay.benchmarks.round2_overload import answers

BODY = json.dumps([round(0.01 * i, 2) for i in range(16)]).encode()
JSON = (("Content-Type", "application/json"),)
HOT = 10  # "the hottest models": ranks 1..HOT
ZIPF_DRAWS = 20000  # one run's request mix, drawn once and cycled


def name(rank: int) -> str:
    return f"m{rank:03d}"


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
    same = {"version": "1.0", "serialized_file": weights, "handler": "tensor", "export_path": store}
    for k in range(1, count + 1):
        package(ArchiveOptions(model_name=name(k), **same))
    return store


def make_server(root: Path, store: Path, models: list[str], budget: int) -> ManagedServer:
    """``torchbay serve`` of ``models``, not started; with a budget every model starts unloaded."""
    run_dir = Path(tempfile.mkdtemp(dir=root))
    config = run_dir / "config.properties"
    workers = "0" if budget else "1"
    config.write_text(
        f"max_loaded_models={budget}\ndefault_workers_per_model={workers}\n"
        "access_log=false\ndisable_system_metrics=true\n"
    )
    models_arg = tuple(f"{m}.mar" for m in models)
    server = ManagedServer.torchbay(
        store / f"{models[0]}.mar",
        run_dir,
        auth=False,
        models=models_arg,
        extra_args=("--ts-config", str(config)),
    )
    server.start_timeout_s = 600
    return server


def series(server: ManagedServer, metric: str) -> dict[str, float]:
    """One multiplexer series by model (``""`` for a server-wide one)."""
    ends = server.endpoints
    assert ends is not None and ends.metrics_port is not None
    text = scrape.fetch_metrics(ends.host, ends.metrics_port, timeout=60)
    samples = scrape.parse_snapshot(text).samples.items()
    return {dict(labels).get("model", ""): v for (n, labels), v in samples if n == metric}


def total(server: ManagedServer, metric: str) -> float:
    return sum(series(server, metric).values())


def closed_loop(
    gen: LoadGenerator,
    port: int,
    models: list[str],
    concurrency: int,
    seconds: float | None,
    timeout: float = 120,
) -> list[tuple[str, int, float]]:
    """The load generator's closed loop over ``models`` in turn (``Target.paths``), for
    ``seconds`` (None: one request per model): (model, status, seconds) per answer."""
    paths = tuple(f"/predictions/{m}" for m in models)
    target = Target("127.0.0.1", port, "", (BODY,), JSON, paths=paths)
    requests = None if seconds else len(models)
    plan = LoadPlan(
        target,
        concurrency=concurrency,
        duration_s=seconds,
        requests=requests,
        timeout_s=timeout,
        timeline=True,
    )
    result = gen.run(plan)
    if result.statuses.get(TIMEOUT):
        raise BenchError(f"{result.statuses[TIMEOUT]} requests unanswered after {timeout} s")
    variants = array.array("I", result.variants)
    pairs = zip(variants, answers(result.timeline), strict=True)
    return [(models[v], int(a.status), a.latency) for v, a in pairs]


def zipf_mix(count: int, s: float, seed: int, draws: int = ZIPF_DRAWS) -> list[str]:
    """``draws`` model names, model k of rank k with probability ~ 1/k^s."""
    rng = random.Random(seed)
    cum = list(itertools.accumulate(1 / k**s for k in range(1, count + 1)))
    return [name(bisect.bisect(cum, rng.random() * cum[-1]) + 1) for _ in range(draws)]


class RssPeak(threading.Thread):
    """The peak summed RSS of a server's workers (``procstat``), sampled every 0.25 s."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.peak_workers = pid, 0.0, 0
        self.done = threading.Event()

    def __enter__(self) -> RssPeak:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.join()

    def run(self) -> None:
        while not self.done.wait(0.25):
            memory = procstat.memory_snapshot(self.pid, with_pss=False)
            if memory.workers_rss_mb > self.peak:
                self.peak, self.peak_workers = memory.workers_rss_mb, memory.processes - 1


def run_single(gen: LoadGenerator, root: Path, store: Path, args: Any) -> dict[str, Any]:
    server = make_server(root, store, [name(1)], budget=0)
    with server as ends:
        closed_loop(gen, ends.inference_port, [name(1)], args.concurrency, 2.0)  # warm
        answered = closed_loop(gen, ends.inference_port, [name(1)], args.concurrency, args.seconds)
        rss = procstat.memory_snapshot(server.pid, with_pss=False).largest_child_rss_mb
    ok = stats.summarize([t for _, status, t in answered if status == 200])
    return {
        "requests": len(answered),
        "errors": len(answered) - ok.count,
        "p50_ms": ok.p50_ms,
        "p99_ms": ok.p99_ms,
        "worker_rss_mb": rss or None,
    }


def run_multiplexed(
    gen: LoadGenerator, root: Path, store: Path, args: Any, seed: int
) -> dict[str, Any]:
    server = make_server(root, store, [name(k) for k in range(1, args.models + 1)], args.budget)
    hot = [name(k) for k in range(1, HOT + 1)]
    with server as ends, RssPeak(server.pid) as sampler:
        port = ends.inference_port
        first = closed_loop(gen, port, hot, HOT, None, timeout=600)  # loads them, in parallel
        if refused := [(m, status) for m, status, _ in first if status != 200]:
            raise BenchError(f"first requests refused: {refused}")
        mix = zipf_mix(args.models, args.zipf, seed)
        sent = len(closed_loop(gen, port, mix, args.concurrency, args.warmup)) % len(mix)
        mix = mix[sent:] + mix[:sent]  # the window goes on with the mix where warm-up left it
        loads0 = total(server, "torchbay_model_loads_total")
        evictions0 = total(server, "torchbay_model_evictions_total")
        answered = closed_loop(gen, port, mix, args.concurrency, args.seconds)
        loads = total(server, "torchbay_model_loads_total") - loads0
        evictions = total(server, "torchbay_model_evictions_total") - evictions0
        loaded_at_end = series(server, "torchbay_loaded_models")[""]
        cold = cold_starts(server, port, args.cold)
    ok = [(m, t) for m, status, t in answered if status == 200]
    hot_times = [t for m, t in ok if m in hot]
    return {
        "requests": len(answered),
        "errors": len(answered) - len(ok),
        "hot_share": len(hot_times) / max(1, len(ok)),
        "hot_p50_ms": stats.summarize(hot_times).p50_ms,
        "hot_p99_ms": stats.summarize(hot_times).p99_ms,
        "all_p99_ms": stats.summarize([t for _, t in ok]).p99_ms,
        "loads_in_window": loads,
        "evictions_in_window": evictions,
        "loaded_models_at_end": loaded_at_end,
        "cold_start_ms": cold,
        "peak_worker_rss_mb": sampler.peak,
        "peak_workers": sampler.peak_workers,
    }


def cold_starts(server: ManagedServer, port: int, count: int) -> list[float]:
    """Requests one after another to unloaded models of the tail (rank order, last first), ms."""
    url = f"http://127.0.0.1:{port}/predictions"
    loaded = series(server, "torchbay_model_loaded")
    times = []
    for model in [m for m in sorted(loaded, reverse=True) if loaded[m] == 0][:count]:
        start = time.perf_counter()
        response = httpx.post(f"{url}/{model}", content=BODY, headers=dict(JSON), timeout=300)
        if response.status_code != 200:
            raise BenchError(f"cold start of {model}: {response.status_code} {response.text}")
        times.append((time.perf_counter() - start) * 1000)
    return times


def summarize(runs: list[dict[str, Any]], args: Any) -> dict[str, Any]:
    def med(part: str, key: str) -> float:
        return statistics.median(r[part][key] for r in runs if r[part][key] is not None)

    single_p99, hot_p99 = med("single", "p99_ms"), med("multiplexed", "hot_p99_ms")
    rss_one = med("single", "worker_rss_mb")
    cold = [statistics.median(r["multiplexed"]["cold_start_ms"]) for r in runs]
    return {
        "command": "python results/multiplex/run.py " + shlex.join(sys.argv[1:]),
        "runs": len(runs),
        "single_p99_ms": single_p99,
        "hot10_p99_ms": hot_p99,
        "hot10_p99_over_single": hot_p99 / single_p99,
        "cold_start_ms": statistics.median(cold),
        "peak_worker_rss_mb": med("multiplexed", "peak_worker_rss_mb"),
        "rss_budget_mb": args.budget * rss_one,
        "one_worker_rss_mb": rss_one,
        "loads_in_window": med("multiplexed", "loads_in_window"),
        "requests_in_window": med("multiplexed", "requests"),
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
    parser.add_argument("--out", type=Path, default=Path("results/multiplex"))
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
