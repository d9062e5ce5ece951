"""Where the capacity goes under overload: cnn (batch 8, 2 workers, the overload row's settings)
at open-loop multiples of its closed-loop capacity, with the CPU of every process (frontend,
workers, load generator: the time each ran on a CPU and the time it waited, runnable, for one,
from Linux's schedstat), the workers' CPU per served request, and the model's describe sampled
every 0.25 s (busy workers, ``predictedQueueWaitMs``, ``serviceRatePerWorker``).

    python -m torchbay.benchmarks.overload_probe --factors 1 2 4 [--duration 10 --warmup 3]

A diagnostic beside ``round2`` (its overload row says how much is lost; this says where).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil

from torchbay.benchmarks import cpushare, round2_overload, runner
from torchbay.benchmarks.loadgen import START_MARGIN_S, LoadGenerator
from torchbay.benchmarks.loadplan import LoadPlan
from torchbay.benchmarks.round2_rows import CNN_B8_W2, JOB_QUEUE_SIZE, QUEUE_DELAY_MS
from torchbay.benchmarks.runner import TORCHBAY, Ctx, closed, serving, target


def _describe_sampler(port: int, samples: list[dict[str, Any]], stop: threading.Event) -> None:
    with httpx.Client(timeout=5) as client:
        while not stop.is_set():
            samples.append(client.get(f"http://127.0.0.1:{port}/models/cnn").json()[0])
            time.sleep(0.25)


def _sched(pid: int) -> tuple[float, float]:
    """Seconds a process's threads have run on a CPU and waited runnable for one (Linux
    ``/proc/<pid>/task/*/schedstat``; zeros where it cannot be read)."""
    ran = waited = 0.0
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                fields = (task / "schedstat").read_text().split()
                ran += int(fields[0]) / 1e9
                waited += int(fields[1]) / 1e9
    return ran, waited


def _cpu(procs: list[psutil.Process]) -> dict[int, tuple[float, float]]:
    return {proc.pid: _sched(proc.pid) for proc in procs if proc.is_running()}


def _processes(front: psutil.Process, me: psutil.Process) -> list[psutil.Process]:
    """The server's processes and the load generator's, each once."""
    found: dict[int, psutil.Process] = {}
    for root in (front, me):
        with contextlib.suppress(psutil.Error):
            for proc in (root, *root.children(recursive=True)):
                found.setdefault(proc.pid, proc)
    return list(found.values())


def _log_cpu(procs, before, after, elapsed, labels, log) -> None:  # type: ignore[no-untyped-def]
    """CPU % of each process over the run and the % of the run it waited runnable for a CPU
    (the host's cores saturated)."""
    log("  CPU % (ran / waited for a CPU) over the run, warm-up included:")
    for proc in procs:
        if proc.pid in after and proc.pid in before:
            ran = after[proc.pid][0] - before[proc.pid][0]
            waited = after[proc.pid][1] - before[proc.pid][1]
            log(
                f"    {100 * ran / elapsed:5.1f} / {100 * waited / elapsed:5.1f}  {labels(proc)} "
                f"(pid {proc.pid})"
            )


def _log_worker_ms(used: dict[str, float] | None, served: float, seconds: float, log: Any) -> None:
    """The workers' CPU per request served in a window inside the measured run (not over the
    whole run: its warm-up and the load generator's idle start would count as serving)."""
    if used is not None and served > 0:
        log(
            f"  worker CPU per served request: {1000 * used[cpushare.WORKERS] / served:.2f} ms "
            f"(a {seconds:g} s window inside the measured run)"
        )


def _label(proc: psutil.Process, front: int, generator: int) -> str:
    if proc.pid == front:
        return "frontend"
    if proc.pid == generator:
        return "probe (this process)"
    try:
        return "worker" if cpushare.is_worker(proc) else "load generator"
    except psutil.Error:
        return "gone"


def probe(ctx: Ctx, factors: Sequence[float], log: Any = print) -> None:
    props = {"job_queue_size": JOB_QUEUE_SIZE, "max_queue_delay_ms": QUEUE_DELAY_MS}
    with serving(ctx, TORCHBAY, {"cnn": CNN_B8_W2}, ctx.out_dir / "probe", props=props) as server:
        assert server.endpoints is not None and server.proc is not None
        tgt = target(ctx, server, "cnn", "cnn")
        front, me = psutil.Process(server.proc.pid), psutil.Process()
        labels = lambda proc: _label(proc, front.pid, me.pid)  # noqa: E731
        procs = _processes(front, me)
        pids = (front.pid, [p.pid for p in ctx.gen.procs])
        opens = cpushare.closed_run_opens(ctx.warmup_s)
        window = cpushare.Window.within(pids, opens, ctx.duration_s)
        before, started = _cpu(procs), time.monotonic()
        capacity = closed(ctx, tgt, 16).ok_per_s
        after, elapsed = _cpu(procs), time.monotonic() - started
        log(f"capacity (closed loop, c=16): {capacity:.1f} req/s")
        _log_cpu(procs, before, after, elapsed, labels, log)
        _log_worker_ms(window.seconds(), capacity * window.span_s, window.span_s, log)
        for factor in factors:
            samples: list[dict[str, Any]] = []
            stop = threading.Event()
            args = (server.endpoints.management_port, samples, stop)
            sampler = threading.Thread(target=_describe_sampler, args=args)
            plan = LoadPlan(
                tgt,
                "open",
                rate=factor * capacity,
                duration_s=ctx.duration_s,
                warmup_s=ctx.warmup_s,
                timeline=True,
                timeout_s=round2_overload.LATE_S,
                max_connections=256,
            )
            procs = _processes(front, me)
            sampler.start()
            opens = START_MARGIN_S + ctx.warmup_s + 0.1  # the run's window, after its warm-up
            window = cpushare.Window.within(pids, opens, ctx.duration_s)
            before, started = _cpu(procs), time.monotonic()
            result = ctx.gen.run(plan)
            after, elapsed = _cpu(procs), time.monotonic() - started
            stop.set()
            sampler.join()
            items = round2_overload.answers(result.timeline)
            d = ctx.duration_s
            stats = round2_overload.phase_stats(
                round2_overload.in_phase(items, 0.0, d),
                d,
                factor * capacity,
                round2_overload.answered_ok_in(items, 0.0, d),
            )
            log(
                f"{factor:g}x: goodput {stats.goodput_per_s:.1f} req/s "
                f"({stats.goodput_per_s / capacity:.2f} of capacity), 503s {stats.rejected_503}, "
                f"admitted p99 {stats.admitted_p99_ms:.0f} ms"
            )
            _log_cpu(procs, before, after, elapsed, labels, log)
            span = window.span_s
            _log_worker_ms(window.seconds(), stats.goodput_per_s * span, span, log)
            _log_samples(samples[len(samples) // 4 :], log)


def _log_samples(samples: list[dict[str, Any]], log: Any) -> None:
    for key in ("predictedQueueWaitMs", "serviceRatePerWorker", "pendingRequests"):
        values = [s[key] for s in samples if s.get(key) is not None]
        if values:
            log(
                f"  {key}: median {statistics.median(values):.1f} "
                f"(min {min(values):.1f}, max {max(values):.1f})"
            )
    busy = [sum(w.get("status") == "BUSY" for w in s.get("workers", [])) for s in samples]
    if busy:
        log(
            f"  busy workers per sample: mean {statistics.mean(busy):.2f} of {len(samples)} samples"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchbay.benchmarks.overload_probe")
    parser.add_argument("--factors", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    parser.add_argument("--duration", type=float, default=10.0, help="measured s per factor")
    parser.add_argument("--warmup", type=float, default=3.0, help="warm-up s per factor")
    parser.add_argument("--work", type=Path, default=Path("benchmarks/out/overload-probe"))
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    assets = runner.archive_models(runner.prepare_models(args.work), args.work, sys.executable)
    with LoadGenerator(1) as gen:
        ctx = Ctx(args.work, assets, gen, args.duration, args.warmup, 1, None)
        probe(ctx, args.factors)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
