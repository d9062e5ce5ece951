"""The handler of the metrics-API records (TorchServe 0.12 and torchbay load the same file).

Each request's body names one use of TorchServe's ``context.metrics`` API that a handler may get
wrong (or that TorchServe treats its own way); the answer is ``{"ok": <body>}``, plus
``"missing": true`` when ``get_metric`` raised TorchServe's MetricsCacheKeyError.
"""

from ts.metrics.dimension import Dimension
from ts.metrics.metric_type_enum import MetricTypes
from ts.torch_handler.base_handler import BaseHandler


def record(metrics, case):
    if case == "wrong_dimension_count":  # TorchServe logs the error and records nothing
        metric = metrics.add_metric_to_cache("WrongDims", "count", ["A", "B"], MetricTypes.COUNTER)
        metric.add_or_update(1, ["x"])
    elif case == "string_gauge":  # TorchServe's frontend cannot parse it: nothing recorded
        metrics.add_metric("StrGauge", "abc", "u", None, [], MetricTypes.GAUGE)
    elif case == "numeric_string_gauge":
        metrics.add_metric("NumStrGauge", "2.5", "u", None, [], MetricTypes.GAUGE)
    elif case == "negative_counter":
        metrics.add_counter("NegCounter", -1)
    elif case == "error":  # add_error: Level "Error", no ModelName
        metrics.add_error("ErrMetric", 1)
    elif case == "dimension_renamed":  # the first call's names take the second's values
        metrics.add_counter("Renamed", 1, None, [Dimension("A", "1")])
        metrics.add_counter("Renamed", 1, None, [Dimension("B", "2")])
    elif case == "unit_changed":  # the first call's unit stays
        metrics.add_time("UnitKept", 1)
        metrics.add_time("UnitKept", 2, None, "s")
    elif case == "nan_gauge":  # TorchServe's frontend cannot parse "nan": nothing recorded
        metrics.add_metric("NanGauge", float("nan"), "u", None, [], MetricTypes.GAUGE)
    elif case == "infinite_gauge":  # nor "inf" / "-inf"
        metrics.add_metric("InfGauge", float("inf"), "u", None, [], MetricTypes.GAUGE)
        metrics.add_metric("NegInfGauge", float("-inf"), "u", None, [], MetricTypes.GAUGE)
    elif case == "nan_histogram":  # whatever the type
        metrics.add_metric("NanHist", float("nan"), "u", None, [], MetricTypes.HISTOGRAM)
        metrics.add_metric("InfCounter", float("inf"), "u", None, [], MetricTypes.COUNTER)
    elif case == "gauge_then_nan":  # the gauge keeps its last finite value
        metrics.add_metric("ThenNan", 3, "u", None, [], MetricTypes.GAUGE)
        metrics.add_metric("ThenNan", float("nan"), "u", None, [], MetricTypes.GAUGE)
    elif case == "get_missing":
        from ts.metrics.metric_cache_errors import MetricsCacheKeyError

        try:
            metrics.get_metric("NoSuchMetric", MetricTypes.GAUGE)
        except MetricsCacheKeyError:
            return {"ok": case, "missing": True}
    return {"ok": case}


class ApiHandler(BaseHandler):
    def handle(self, data, context):
        out = []
        for row in data:
            body = row.get("data") or row.get("body")
            case = body.decode() if isinstance(body, (bytes, bytearray)) else str(body)
            out.append(record(context.metrics, case))
        return out
