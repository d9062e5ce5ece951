from __future__ import annotations

import pytest

from torchbay.handlers.context import Context
from torchbay.handlers.errors import BadInput, HandlerError, PredictionException
from torchbay.handlers.metrics import Dimension, MetricsCache, MetricsCacheKeyError, MetricTypes


def test_metrics_api_records_plain_dicts() -> None:
    cache = MetricsCache("m")
    cache.add_time("Latency", 1.5)
    cache.add_size("Blob", 2, unit="kB", dimensions=[Dimension("Part", "a")])
    cache.add_percent("Busy", 50)
    cache.add_metric("Raw", 3, "items", metric_type=MetricTypes.HISTOGRAM)
    cache.set_gauge("Queue", 4, dimensions={"Level": "Host"})
    metric = cache.add_metric_to_cache("Hits", "count", ["Route"], MetricTypes.COUNTER)
    metric.add_or_update(1, ["/a"])
    cache.get_metric("Hits", MetricTypes.COUNTER).update(2)
    metric.add_or_update(1, [])  # another count of values: logged, nothing recorded
    with pytest.raises(MetricsCacheKeyError):  # TorchServe's KeyError: never created here
        cache.get_metric("Hits", MetricTypes.GAUGE)
    records = cache.drain()
    assert cache.drain() == []
    assert [(r["name"], r["type"], r["unit"], r["value"]) for r in records] == [
        ("Latency", "gauge", "ms", 1.5),
        ("Blob", "gauge", "kB", 2.0),
        ("Busy", "gauge", "percent", 50.0),
        ("Raw", "histogram", "items", 3.0),
        ("Queue", "gauge", "", 4.0),
        ("Hits", "counter", "count", 1.0),
        ("Hits", "counter", "count", 2.0),
    ]
    assert records[1]["dimensions"] == {"ModelName": "m", "Level": "Model", "Part": "a"}
    assert records[4]["dimensions"]["Level"] == "Host"
    assert records[5]["dimensions"]["Route"] == "/a"


def test_add_calls_go_through_the_cached_metric_as_torchserves() -> None:
    """TorchServe's _get_or_add_metric: the metrics_config's metric (else the first call's)
    takes a later call's dimension values by position, keeps its unit, and refuses (logs) another
    count of values."""
    declared = [("InferenceCount", "counter", "Count", ("Color", "ModelName", "Level"))]
    cache = MetricsCache("m", declared)
    cache.add_counter("InferenceCount", 1, None, [Dimension("Shape", "round")])
    cache.add_counter("InferenceCount", 1, None, [Dimension("A", "x"), Dimension("B", "y")])
    cache.add_time("Took", 1)
    cache.add_time("Took", 2, None, "s", [Dimension("Stage", "pre")])  # another count: dropped
    cache.add_time("Took", 3, None, "s")
    got = [(r["name"], r["unit"], r["value"], r["dimensions"]) for r in cache.drain()]
    model = {"ModelName": "m", "Level": "Model"}
    assert got == [
        ("InferenceCount", "Count", 1.0, {"Color": "round", **model}),
        ("Took", "ms", 1.0, model),
        ("Took", "ms", 3.0, model),
    ]


def test_context_per_request_state() -> None:
    context = Context("m", "/tmp/m", {"model": {}}, 2, None, "1.0")
    assert context.system_properties["server_name"] == "MMS"
    assert context.system_properties["limit_max_image_pixels"] is True
    context.reset_batch(["a", "b"], [{"x-h": "1"}, {"ts_request_sequence_id": "s"}])
    assert context.get_request_id(1) == "b" and context.get_request_header(0, "x-h") == "1"
    assert context.get_all_request_header(0) == {"x-h": "1"}
    assert context.get_sequence_id(1) == "s"
    context.set_response_status(404, "nope", idx=1)
    context.set_response_content_type(0, "text/csv")
    assert context.get_response_status(1) == (404, "nope")
    assert context.get_response_content_type(0) == "text/csv"
    context.set_all_response_status(202, "accepted")
    assert [context.get_response_status(i)[0] for i in range(2)] == [202, 202]
    context.reset_batch(["c"], [{}])
    assert context.get_response_status(0) == (200, None)


def test_error_tree() -> None:
    exc = BadInput("bad")
    assert isinstance(exc, PredictionException) and isinstance(exc, HandlerError)
    assert (exc.error_code, exc.message) == (400, "bad")
    assert PredictionException("x").error_code == 500
    assert PredictionException("x", error_code=503).error_code == 503
