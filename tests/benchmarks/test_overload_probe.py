"""The overload probe's report of describe samples (the live part is a benchmark, not a test)."""

from __future__ import annotations

from torchbay.benchmarks.overload_probe import _log_samples, main


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
