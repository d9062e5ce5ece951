"""The overload probe's report of describe samples (the live part is a benchmark, not a test)."""

from __future__ import annotations

import os

from torchbay.benchmarks.overload_probe import _log_cpu, _log_samples, _log_worker_ms, _sched, main


def test_samples_report_medians_and_busy_workers() -> None:
    samples = [
        {"predictedQueueWaitMs": w, "serviceRatePerWorker": r, "pendingRequests": q,
         "workers": [{"status": "BUSY"}, {"status": s}]}
        for w, r, q, s in ((100.0, 60.0, 20, "BUSY"), (200.0, 50.0, 30, "READY"),
                           (300.0, 70.0, 40, "BUSY"))
    ]  # fmt: skip
    lines: list[str] = []
    _log_samples(samples, lines.append)
    assert lines == [
        "  predictedQueueWaitMs: median 200.0 (min 100.0, max 300.0)",
        "  serviceRatePerWorker: median 60.0 (min 50.0, max 70.0)",
        "  pendingRequests: median 30.0 (min 20.0, max 40.0)",
        "  busy workers per sample: mean 1.67 of 3 samples",
    ]


def test_help_names_the_factors(capsys) -> None:
    try:
        main(["--help"])
    except SystemExit as exc:
        assert exc.code == 0
    assert "--factors" in capsys.readouterr().out


def test_cpu_report_shows_run_and_wait() -> None:
    class Proc:
        def __init__(self, pid: int) -> None:
            self.pid = pid

    procs = [Proc(1), Proc(2), Proc(3)]
    before = {1: (10.0, 1.0), 2: (20.0, 2.0), 3: (5.0, 0.0)}
    after = {1: (12.0, 1.5), 2: (27.0, 4.0), 3: (5.5, 0.0)}
    labels = {1: "frontend", 2: "worker", 3: "load generator"}
    lines: list[str] = []
    _log_cpu(procs, before, after, 10.0, lambda p: labels[p.pid], lines.append)
    assert lines == [
        "  CPU % (ran / waited for a CPU) over the run, warm-up included:",
        "     20.0 /   5.0  frontend (pid 1)",
        "     70.0 /  20.0  worker (pid 2)",
        "      5.0 /   0.0  load generator (pid 3)",
    ]


def test_worker_cpu_per_request_comes_from_a_window_of_served_requests() -> None:
    lines: list[str] = []
    used = {"frontend": 1.0, "workers": 14.0, "load generator": 0.5}
    _log_worker_ms(used, 4000, 8, lines.append)
    _log_worker_ms(None, 4000, 8, lines.append)  # the run ended before the window did
    _log_worker_ms(used, 0, 8, lines.append)  # nothing served
    assert lines == [
        "  worker CPU per served request: 3.50 ms (a 8 s window inside the measured run)"
    ]


def test_sched_reads_this_process_threads() -> None:
    ran, waited = _sched(os.getpid())
    assert ran > 0 and waited >= 0  # the test itself has run on a CPU
    assert _sched(2**22 + 12345) == (0.0, 0.0)  # no such process
