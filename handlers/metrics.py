"""The ``context.metrics`` handle: TorchServe's MetricsCacheYamlImpl API, recording plain dicts.

Handlers record custom metrics here; the Service drains the buffer after each batch and the dicts
ride back to the frontend with the results (workers never touch Prometheus). A record is::

    {"name": str, "type": "counter" | "gauge" | "histogram", "unit": str, "value": float,
     "dimensions": {str: str}}

with ``ModelName`` and ``Level="Model"`` added after the dimensions unless given, and a
``"request_id"`` when the call named one request of the batch (``idx``, or ``add_or_update``'s
``request_id``; else the batch's request ids are the record's). Torch-free.

At most ``MAX_RECORDS`` records ride back with one batch (the frontend parses and records each
on its event loop), each with at most ``MAX_DIMENSIONS`` dimensions and no name or value longer
than ``MAX_TEXT``: the others are dropped, and the drain logs how many.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

logger = logging.getLogger(__name__)

# Records kept per batch: a handler recording a metric in a hot loop must not stall the frontend
# (a million records took it ~6 s and ~1 GB to take in).
MAX_RECORDS = 10_000
# Each one becomes a Prometheus series label set the frontend keeps (up to its series cap): a
# record with more dimensions, or a name, unit or dimension longer, is dropped.
MAX_DIMENSIONS = 16
MAX_TEXT = 256
# Metrics cached by type and name (TorchServe's backend caches every one it sees): past this many,
# a new name is recorded as given, uncached.
MAX_CACHED = 1000


def _bounded(record: dict[str, Any]) -> bool:
    dims = record["dimensions"]
    texts = (record["name"], record["unit"], *dims, *dims.values(), record.get("request_id", ""))
    return len(dims) <= MAX_DIMENSIONS + 2 and all(len(t) <= MAX_TEXT for t in texts)


class MetricsCacheKeyError(KeyError):
    """TorchServe's ``ts.metrics.metric_cache_errors.MetricsCacheKeyError``: ``get_metric`` of
    a metric the cache does not hold."""


class MetricsCacheValueError(ValueError):
    """TorchServe's ``MetricsCacheValueError`` (importable; torchbay raises none)."""


class MetricsCacheTypeError(TypeError):
    """TorchServe's ``MetricsCacheTypeError`` (importable; torchbay raises none)."""


class GeneralMetricsCacheError(Exception):
    """TorchServe's ``GeneralMetricsCacheError`` (importable; torchbay raises none)."""


class MetricTypes(str, enum.Enum):
    """TorchServe's ``ts.metrics.metric_type_enum.MetricTypes``."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


class Dimension:
    """TorchServe's ``ts.metrics.dimension.Dimension``: a name/value pair."""

    def __init__(self, name: str, value: str) -> None:
        self.name = name
        self.value = value

    def __repr__(self) -> str:
        return f"Dimension({self.name!r}, {self.value!r})"


DimensionsLike = Mapping[str, Any] | Iterable[Dimension] | None


def _type_name(metric_type: MetricTypes | str) -> str:
    value = metric_type.value if isinstance(metric_type, MetricTypes) else str(metric_type).lower()
    if value not in ("counter", "gauge", "histogram"):
        raise ValueError(f"unknown metric type {metric_type!r}")
    return value


class Metric:
    """A named metric with fixed dimension names, as ``add_metric_to_cache`` returns it."""

    def __init__(
        self,
        cache: MetricsCache,
        name: str,
        unit: str,
        dimension_names: Sequence[str],
        metric_type: MetricTypes | str,
    ) -> None:
        self._cache = cache
        self.name = name
        self.unit = unit
        self.dimension_names = list(dimension_names)
        self.metric_type = MetricTypes(_type_name(metric_type))

    def add_or_update(
        self, value: float, dimension_values: Sequence[str] = (), request_id: str = ""
    ) -> None:
        """Record ``value`` with one value per dimension name (in order). Another count of values
        records nothing and logs the error, as TorchServe's CachingMetric does (the handler's
        call goes on: a metric never fails a request)."""
        if dimension_values is None or len(dimension_values) != len(self.dimension_names):
            logger.error(
                "[METRICS]Failed to update metric with name:%s with value: %s: Dimension values: "
                "%s should correspond to Dimension names: %s",
                self.name,
                value,
                dimension_values,
                self.dimension_names,
            )
            return
        dims = dict(zip(self.dimension_names, (str(v) for v in dimension_values), strict=True))
        self._cache._emit(self.name, self.metric_type.value, self.unit, value, dims, request_id)

    def update(self, value: float, request_id: str = "", dimensions: DimensionsLike = None) -> None:
        """Record ``value`` with the given dimensions (or none beyond the defaults)."""
        dims = _dims(dimensions)
        dims.setdefault("ModelName", self._cache.model_name)
        dims.setdefault("Level", "Model")
        self._cache._emit(self.name, self.metric_type.value, self.unit, value, dims, request_id)


def _dims(dimensions: DimensionsLike) -> dict[str, str]:
    if dimensions is None:
        return {}
    if isinstance(dimensions, Mapping):
        return {str(k): str(v) for k, v in dimensions.items()}
    return {str(d.name): str(d.value) for d in dimensions}


def _fixed_unit(method: str, unit: str, default: MetricTypes) -> Callable[..., None]:
    """TorchServe's ``add_<kind>(name, value, idx=None, dimensions=None, metric_type=...)``."""

    def add(
        self: MetricsCache,
        name: str,
        value: float,
        idx: int | None = None,
        dimensions: DimensionsLike = None,
        metric_type: MetricTypes | str = default,
    ) -> None:
        self._record(name, _type_name(metric_type), unit, value, _dims(dimensions), idx=idx)

    add.__name__ = add.__qualname__ = method
    return add


def _default_unit(method: str, default_unit: str, default: MetricTypes) -> Callable[..., None]:
    """TorchServe's ``add_<kind>(name, value, idx=None, unit=..., dimensions=None, ...)``."""

    def add(
        self: MetricsCache,
        name: str,
        value: float,
        idx: int | None = None,
        unit: str = default_unit,
        dimensions: DimensionsLike = None,
        metric_type: MetricTypes | str = default,
    ) -> None:
        self._record(name, _type_name(metric_type), unit, value, _dims(dimensions), idx=idx)

    add.__name__ = add.__qualname__ = method
    return add


class MetricsCache:
    """Buffer of custom metric records for one model; ``drain()`` empties it."""

    def __init__(self, model_name: str, definitions: Sequence[Sequence[Any]] | None = None) -> None:
        """``definitions``: the metrics_config's model metrics, ``(name, type, unit,
        dimension names)`` each, in the cache from the start as TorchServe's backend has them
        (``get_metric`` finds them); one that is not such a row is skipped."""
        self.model_name = model_name
        self._buffer: list[dict[str, Any]] = []
        self._dropped = 0  # records past MAX_RECORDS since the last drain
        self._metrics: dict[tuple[str, str], Metric] = {}
        self.request_ids: dict[int, str] | None = None
        # The worker's metrics spill (server.serving.spill): each record is also written there,
        # for the frontend to read if the worker dies before the batch's results are sent.
        self.spill: Any = None
        for row in definitions or ():
            try:
                name, kind, unit, dims = row
                self.add_metric_to_cache(str(name), str(unit), [str(d) for d in dims], kind)
            except (TypeError, ValueError):
                logger.warning("model %s: metric definition %r skipped", model_name, row)

    # -- recording ----------------------------------------------------------------------------
    def _record(
        self,
        name: str,
        metric_type: str,
        unit: str,
        value: float,
        dims: dict[str, str],
        defaults: bool = True,
        idx: int | None = None,
    ) -> None:
        """TorchServe's ``add_*``: the handler's dimensions, then ModelName and Level (its
        ``_add_default_dims`` appends them; ``defaults`` false: as given), recorded through the
        cached metric of this type and name (``_get_or_add_metric``): the metrics_config's, or
        the one the first call cached. Its dimension names take the values by position (another
        count is logged and dropped) and its unit stays, as in TorchServe. With ``idx``, the
        record names that request of the batch alone (TorchServe's ``_get_req``)."""
        ids = self.request_ids
        rid = ids.get(idx, "") if idx is not None and isinstance(ids, dict) else ""
        dimensions = {**dims}
        if defaults:
            dimensions.setdefault("ModelName", self.model_name)
            dimensions.setdefault("Level", "Model")
        key = (metric_type, str(name))
        metric = self._metrics.get(key)
        if metric is not None:
            metric.add_or_update(value, list(dimensions.values()), rid)
            return
        if len(self._metrics) < MAX_CACHED:  # names come from the handler: keep the map bounded
            self._metrics[key] = Metric(self, str(name), str(unit), list(dimensions), metric_type)
        self._emit(str(name), metric_type, unit, value, dimensions, rid)

    def _emit(
        self,
        name: str,
        metric_type: str,
        unit: str,
        value: float,
        dimensions: dict[str, str],
        request_id: object = "",
    ) -> None:
        """One record, with exactly these dimensions; ``request_id`` (a request of the batch, or
        the handler's own) is the record's ``request_id``, else the batch's are its."""
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            number = math.nan
        if not math.isfinite(number):
            # TorchServe's frontend cannot parse such a metric line (``abc``, ``nan``, ``inf``):
            # it logs it and drops it, whatever the type (the handler's call goes on).
            logger.error("[METRICS]metric %s: value %r is no finite number, dropped", name, value)
            return
        record = {
            "name": str(name),
            "type": metric_type,
            "unit": str(unit),
            "value": number,
            "dimensions": dimensions,
        }
        if request_id:
            record["request_id"] = str(request_id)
        if len(self._buffer) >= MAX_RECORDS or not _bounded(record):
            self._dropped += 1
        else:
            self._buffer.append(record)
            if self.spill is not None:
                self.spill.add(record)

    def drain(self) -> list[dict[str, Any]]:
        """Return and clear every record made since the last drain."""
        out, self._buffer = self._buffer, []
        if self.spill is not None:
            self.spill.clear()  # they ride back with the batch's results
        if self._dropped:
            logger.warning(
                "model %s: %d custom metric records dropped (past the %d of one batch, more "
                "than %d dimensions, or a name or value past %d characters)",
                self.model_name,
                self._dropped,
                MAX_RECORDS,
                MAX_DIMENSIONS,
                MAX_TEXT,
            )
            self._dropped = 0
        return out

    def mark(self) -> int:
        """Where the buffer stands now (for ``rewind``)."""
        return len(self._buffer)

    def rewind(self, mark: int) -> None:
        """Forget the records made since ``mark``: a handler run that raised, whose batch is run
        again in halves (handlers.runtime.service), so that each request's are made once."""
        if len(self._buffer) > mark:
            del self._buffer[mark:]
            if self.spill is not None:
                self.spill.clear()
                for record in self._buffer:
                    self.spill.add(record)

    # -- TorchServe's convenience API -----------------------------------------------------------
    def add_metric(
        self,
        name: str,
        value: float,
        unit: str,
        idx: int | None = None,
        dimensions: DimensionsLike = None,
        metric_type: MetricTypes | str = MetricTypes.COUNTER,
    ) -> None:
        self._record(name, _type_name(metric_type), unit, value, _dims(dimensions), idx=idx)

    # TorchServe's signatures, positional order included (see _fixed_unit and _default_unit).
    add_counter = _fixed_unit("add_counter", "count", MetricTypes.COUNTER)
    add_time = _default_unit("add_time", "ms", MetricTypes.GAUGE)
    add_size = _default_unit("add_size", "MB", MetricTypes.GAUGE)
    add_percent = _fixed_unit("add_percent", "percent", MetricTypes.GAUGE)

    def add_error(self, name: str, value: float, dimensions: DimensionsLike = None) -> None:
        """A counter with TorchServe's error defaults: ``Level`` ``Error`` after the handler's
        dimensions, and no ``ModelName`` (its ``_add_default_dims`` without a request)."""
        dims = _dims(dimensions)
        dims.setdefault("Level", "Error")
        self._record(name, "counter", "", value, dims, False)

    def set_gauge(
        self, name: str, value: float, unit: str = "", dimensions: DimensionsLike = None
    ) -> None:
        """Record a gauge's current value."""
        self._record(name, "gauge", unit, value, _dims(dimensions))

    def add_metric_to_cache(
        self,
        metric_name: str,
        unit: str,
        dimension_names: Sequence[str] = (),
        metric_type: MetricTypes | str = MetricTypes.COUNTER,
    ) -> Metric:
        metric = Metric(self, metric_name, unit, dimension_names, metric_type)
        self._metrics[(metric.metric_type.value, metric_name)] = metric
        return metric

    def get_metric(
        self, metric_name: str, metric_type: MetricTypes | str = MetricTypes.COUNTER
    ) -> Metric:
        """The metric cached under this name and type (``add_metric_to_cache``, the
        metrics_config's ``model_metrics``); MetricsCacheKeyError if none, as in TorchServe."""
        key = (_type_name(metric_type), metric_name)
        if key not in self._metrics:
            raise MetricsCacheKeyError(
                f"Metric of type '{key[0]}' and name '{metric_name}' doesn't exist"
            )
        return self._metrics[key]
