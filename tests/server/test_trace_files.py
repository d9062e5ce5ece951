"""The trace extension's sampling and files without a server (plane/trace.py, trace_file.py):
the trace file's array closed when the tracer closes, the traces held for the end written there,
a trace that finishes after its setting was replaced still written, and a write that fails
logged without raising."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from torchbay.server.plane.trace import Tracer


def _run(tracer: Tracer, model: str, n: int) -> int:
    """``n`` requests to ``model``; how many were traced."""
    traced = 0
    for _ in range(n):
        trace = tracer.start(model, time.perf_counter())
        if trace is not None:
            traced += 1
            trace.responded()
            tracer.finish(trace)
    return traced


def test_held_traces_close_the_array_when_the_tracer_closes(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    tracer = Tracer(str(path))
    assert not tracer.active and tracer.start("m", time.perf_counter()) is None
    tracer.settings(None, {"trace_level": ["TIMESTAMPS"], "trace_rate": "3"})
    assert tracer.active
    assert _run(tracer, "m", 9) == 3  # every third request
    tracer.close()
    traces = json.loads(path.read_text())
    assert [t["id"] for t in traces] == [1, 2, 3]
    assert [s["name"] for s in traces[0]["timestamps"]] == [
        "REQUEST_START",
        "COMPUTE_END",
        "REQUEST_END",
    ]  # never queued: no QUEUE_START or COMPUTE_START is made up
    assert not list(tmp_path.glob("trace.json.*"))


def test_a_trace_that_outlives_its_setting_is_written(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    tracer = Tracer(str(path))
    tracer.settings("m", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "log_frequency": "5"})
    late = tracer.start("m", time.perf_counter())
    assert late is not None
    tracer.settings("m", {"trace_level": None})  # the model falls back to the global: off
    assert not tracer.active
    tracer.finish(late)
    tracer.close()
    (written,) = tmp_path.glob("trace.json.*")  # its setting had a log frequency: an index file
    assert [t["model_name"] for t in json.loads(written.read_text())] == ["m"]


def test_a_failed_write_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tracer = Tracer(str(tmp_path / "missing" / "trace.json"))
    tracer.settings(None, {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "log_frequency": "1"})
    with caplog.at_level(logging.ERROR, logger="torchbay.trace"):
        assert _run(tracer, "m", 2) == 2
        tracer.close()  # the writes have run
    failures = [r for r in caplog.records if r.name == "torchbay.trace"]
    assert len(failures) == 2 and "No such file or directory" in failures[0].getMessage()
