"""observe/oip_stats.py on its own: which worker stage feeds which Triton statistic, per-request
and per-batch-size accounting, the observer fan-out and the hook chain."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchbay.server.observe.logs import RequestRecord
from torchbay.server.observe.oip_stats import Observers, OipStats, chain
from torchbay.server.serving.model import Observer
from torchbay.server.serving.slot import BatchRecord


@dataclass(eq=False)
class _Version:
    """What the accumulator reads of a model version (its name and version; hashed by id)."""

    name: str
    version: str


def _batch(size: int, **timings_ms: float) -> BatchRecord:
    return BatchRecord(size=size, queue_times_s=[0.0] * size, timings_ms=timings_ms, metrics=[])


def _request(mv: Any, status: int, seconds: float, queue_s: float | None) -> RequestRecord:
    return RequestRecord({}, "m", None, status, seconds, queue_s, mv)


def test_stages_feed_compute_stats_per_request_and_per_batch_size() -> None:
    stats, mv = OipStats(), _Version("m", "1.0")
    stats.batch_done(mv, _batch(2, preprocess=1.0, inference=2.0, postprocess=3.0, handler=7.0))
    stats.batch_done(mv, _batch(1, handler=5.0))  # no stages: the whole handler is compute_infer
    (body,) = stats.model_stats([mv])["model_stats"]
    inf = body["inference_stats"]
    assert body["execution_count"] == 2
    # Each request of a batch is charged the batch's duration, as Triton does.
    assert inf["compute_input"] == {"count": 2, "ns": 2_000_000}
    assert inf["compute_infer"] == {"count": 3, "ns": 2 * 2_000_000 + 5_000_000}
    assert inf["compute_output"] == {"count": 2, "ns": 6_000_000}
    assert body["batch_stats"] == [
        {"batch_size": 1, "compute_input": {"count": 0, "ns": 0},
         "compute_infer": {"count": 1, "ns": 5_000_000}, "compute_output": {"count": 0, "ns": 0}},
        {"batch_size": 2, "compute_input": {"count": 1, "ns": 1_000_000},
         "compute_infer": {"count": 1, "ns": 2_000_000},
         "compute_output": {"count": 1, "ns": 3_000_000}},
    ]  # fmt: skip


def test_requests_success_fail_queue_and_unrouted() -> None:
    stats, mv = OipStats(), _Version("m", "1.0")
    stats.request_done(_request(mv, 200, 0.5, 0.25))
    stats.request_done(_request(mv, 503, 0.001, None))  # refused at admission: never queued
    stats.request_done(_request(None, 404, 0.1, None))  # unknown model: charged to nobody
    (body,) = stats.model_stats([mv])["model_stats"]
    inf = body["inference_stats"]
    assert inf["success"] == {"count": 1, "ns": 500_000_000}
    assert inf["fail"] == {"count": 1, "ns": 1_000_000}
    assert inf["queue"] == {"count": 1, "ns": 250_000_000}
    assert body["inference_count"] == 1 and body["last_inference"] > 0
    # A cache hit (answered, no worker took it) is in Triton's queue count, with no time.
    stats.request_done(_request(mv, 200, 0.001, None))
    inf = stats.model_stats([mv])["model_stats"][0]["inference_stats"]
    assert inf["queue"] == {"count": 2, "ns": 250_000_000} and inf["success"]["count"] == 2
    fresh = stats.model_stats([_Version("other", "2")])["model_stats"][0]
    assert fresh["name"] == "other" and fresh["version"] == "2"
    assert fresh["inference_count"] == 0 and fresh["batch_stats"] == []


class _Recorder(Observer):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def batch_done(self, model: Any, record: BatchRecord) -> None:
        self.calls.append("batch")

    def worker_started(self, model: Any, worker: Any, restart: bool) -> None:
        self.calls.append(f"started restart={restart}")

    def worker_start_failed(self, model: Any, error: Exception) -> None:
        self.calls.append("failed")

    def worker_recycled(self, model: Any, worker: Any) -> None:
        self.calls.append("recycled")


def test_observers_fan_out_and_hooks_chain() -> None:
    a, b = _Recorder(), _Recorder()
    both = Observers(a, b)
    mv = _Version("m", "1")
    both.batch_done(mv, _batch(1))  # type: ignore[arg-type]
    both.worker_started(mv, None, restart=True)  # type: ignore[arg-type]
    both.worker_start_failed(mv, RuntimeError("x"))  # type: ignore[arg-type]
    both.worker_recycled(mv, None)  # type: ignore[arg-type]
    assert a.calls == b.calls == ["batch", "started restart=True", "failed", "recycled"]
    seen: list[str] = []
    hook = chain(lambda r: seen.append("first"), None, lambda r: seen.append("second"))
    hook(_request(None, 200, 0.0, None))
    assert seen == ["first", "second"]
