"""Custom handler metrics (``context.metrics``), registered on the server's registry on sight.

Workers send each record back with the batch's results (handlers.metrics documents the shape);
the frontend registers a Prometheus metric per name and type, labelled ``model``, ``version`` and
the record's dimension names, both sanitised to Prometheus' rules. Metric names are kept as the
handler gave them (no prefix), as TorchServe's Prometheus mode does. Torch-free.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from torchbay.server.serving.model import ModelVersion

log = logging.getLogger("torchbay.metrics")

LABELS = ("model", "version")
# Unit-agnostic buckets for handler histograms (handlers mostly report milliseconds).
CUSTOM_BUCKETS = (
    0.001,
    0.01,
    0.1,
    0.5,
    1,
    2.5,
    5,
    10,
    25,
    50,
    100,
    250,
    500,
    1000,
    2500,
    5000,
    10000,
    60000,
)

_NAME_BAD = re.compile(r"[^a-zA-Z0-9_:]")
_LABEL_BAD = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(raw: str) -> str:
    """``raw`` made a valid Prometheus metric name (invalid characters become ``_``)."""
    name = _NAME_BAD.sub("_", raw) or "_"
    return "_" + name if name[0].isdigit() else name


def label_name(raw: str) -> str:
    """``raw`` made a valid, non-reserved label name; ``model``/``version`` become
    ``exported_model``/``exported_version`` (Prometheus' own rule for clashing labels)."""
    name = _LABEL_BAD.sub("_", raw) or "_"
    if name[0].isdigit():
        name = "_" + name
    if name.startswith("__"):
        name = "x" + name
    return "exported_" + name if name in LABELS else name


def utf8_records(records: list[Any]) -> list[Any]:
    """``records`` with every name, unit, type and dimension UTF-8 text: a lone surrogate (a
    handler may copy one from a client's JSON) becomes ``?``. One such string in any family
    made prometheus_client's exposition, so every scrape, fail."""
    return [_utf8_record(rec) if isinstance(rec, dict) else rec for rec in records]


def _utf8_record(rec: dict[str, Any]) -> dict[str, Any]:
    out = {k: _utf8(v) if isinstance(v, str) else v for k, v in rec.items()}
    dims = rec.get("dimensions")
    if isinstance(dims, dict):
        out["dimensions"] = {
            _utf8(str(k)): _utf8(v) if isinstance(v, str) else v for k, v in dims.items()
        }
    return out


def _utf8(text: str) -> str:
    if text.isascii():
        return text
    return text.encode("utf-8", "replace").decode("utf-8")


def _written(name: str, kind: str) -> set[str]:
    """The names prometheus_client writes for a metric ``name`` of ``kind`` (text 0.0.4, no
    ``_created``): a counter's ``<base>_total``, a histogram's own and its samples'."""
    if kind == "counter":
        return {name.removesuffix("_total") + "_total"}
    if kind == "histogram":
        return {name, *(f"{name}_{suffix}" for suffix in ("bucket", "count", "sum"))}
    return {name}


class _Custom:
    __slots__ = ("children", "keys", "kind", "metric")

    def __init__(self, kind: str, keys: tuple[str, ...], metric: Any) -> None:
        self.kind = kind
        self.keys = keys  # the raw dimension names, sorted
        self.metric = metric
        self.children: dict[tuple[Any, ...], Any] = {}


class CustomMetrics:
    """Handler metrics (``context.metrics``) registered on first sight, by name and type.

    A record is ``{"name", "type": counter|gauge|histogram, "unit", "value", "dimensions"}``.
    Labels are ``model``, ``version`` and the record's dimension names (sanitised). A record
    that cannot be recorded (another type or dimension set than the metric's first record, a
    name clashing with a server metric, TorchServe's families included, a negative counter
    increment, a NaN or infinite value of any type (TorchServe's frontend cannot parse it), past
    ``max_metrics`` metrics) is dropped and logged once; past ``max_series`` label sets of one
    metric, the oldest label set goes (logged once), as a TorchServe family's do
    (observe.ts_families): a server that registers ever new versions keeps publishing the new
    ones' series. A version gone long ago loses its series with its others (``forget``,
    observe.retired). The server never fails on a handler's metric.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        max_metrics: int = 100,
        max_series: int = 1000,
        reserved: Callable[[str], bool] = lambda name: False,
    ) -> None:
        self.registry = registry
        # Names exposed outside ``registry`` (TorchServe's families, observe.ts_families): a
        # second family of one name makes Prometheus reject the whole scrape.
        self.reserved = reserved
        self.max_metrics = max_metrics
        self.max_series = max_series
        self._metrics: dict[str, _Custom | None] = {}  # raw name -> metric, None if refused
        self.written: set[str] = set()  # the family and sample names the metrics write
        self._warned: set[str] = set()

    def record(self, mv: ModelVersion, records: list[dict[str, Any]]) -> None:
        for rec in records:
            try:
                self._record_one(mv, rec)
            except Exception as exc:  # a handler's bad metric never reaches the request path
                name = rec.get("name") if isinstance(rec, dict) else None
                self._warn(f"value:{name}", "dropping custom metric %r: %s", name, exc)

    def _record_one(self, mv: ModelVersion, rec: dict[str, Any]) -> None:
        raw = str(rec["name"])
        kind = str(rec.get("type", "counter"))
        dims = rec.get("dimensions") or {}
        keys = tuple(sorted(dims))
        entry = self._metrics.get(raw)
        if entry is None:
            if raw in self._metrics:
                return  # refused before, already logged
            entry = self._register(raw, kind, keys, str(rec.get("unit", "")))
            if entry is None:
                return
        if entry.kind != kind or entry.keys != keys:
            self._warn(
                f"shape:{raw}",
                "dropping custom metric %r: recorded as %s %s before, now %s %s",
                raw,
                entry.kind,
                list(entry.keys),
                kind,
                list(keys),
            )
            return
        value = float(rec["value"])
        if not math.isfinite(value):  # TorchServe drops it; a counter would stay NaN for good
            self._warn(f"finite:{raw}", "dropping custom metric %r: value %r", raw, value)
            return
        values = (mv.name, mv.version, *(str(dims[k]) for k in keys))
        child = entry.children.get(values)
        if child is None:
            if len(entry.children) >= self.max_series:  # the oldest goes (a version long gone)
                self._warn(f"series:{raw}", "custom metric %r: too many label sets", raw)
                oldest = next(iter(entry.children))
                del entry.children[oldest]
                entry.metric.remove(*oldest)
            child = entry.children[values] = entry.metric.labels(*values)
        if kind == "counter":
            child.inc(value)
        elif kind == "gauge":
            child.set(value)
        else:
            child.observe(value)

    def forget(self, key: tuple[str, str]) -> None:
        """Drop every series of version ``key`` (model, version): a version gone long ago, whose
        other series observe.retired dropped. A scan of every series, once per version dropped."""
        for entry in self._metrics.values():
            if entry is None:
                continue
            for values in [v for v in entry.children if v[:2] == key]:
                del entry.children[values]
                entry.metric.remove(*values)

    def _register(self, raw: str, kind: str, keys: tuple[str, ...], unit: str) -> _Custom | None:
        if len(self._metrics) >= self.max_metrics:
            self._warn("cap", "more than %d custom metrics; dropping new ones", self.max_metrics)
            return None  # not remembered either: the map stays bounded
        cls = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}.get(kind)
        labels = (*LABELS, *(label_name(k) for k in keys))
        name = metric_name(raw)
        doc = f"Custom handler metric {raw}" + (f" ({unit})" if unit else "")
        try:
            if cls is None:
                raise ValueError(f"unknown metric type {kind!r}")
            if len(set(labels)) != len(labels):
                raise ValueError(f"dimension names clash once sanitised: {list(keys)}")
            written = _written(name, kind)
            if any(map(self.reserved, written | {name, name.removesuffix("_total")})):
                raise ValueError(f"{name} is one of the server's TorchServe metrics")
            extra = {"buckets": CUSTOM_BUCKETS} if cls is Histogram else {}
            metric = cls(name, doc, labels, registry=self.registry, **extra)
            self.written |= written
        except ValueError as exc:  # bad type, clashing labels, or a name already registered
            self._warn(f"register:{raw}", "refusing custom metric %r: %s", raw, exc)
            self._metrics[raw] = None
            return None
        entry = self._metrics[raw] = _Custom(kind, keys, metric)
        return entry

    def _warn(self, key: str, message: str, *args: Any) -> None:
        if key in self._warned or len(self._warned) > 10 * self.max_metrics:
            return
        self._warned.add(key)
        log.warning(message, *args)
