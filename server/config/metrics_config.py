"""TorchServe's ``metrics_config``: which of TorchServe's metrics exist, their types, units and
dimensions (the YAML of TorchServe's ``ts/configs/metrics.yaml``, ``DEFAULT_YAML`` here).

Two groups: ``ts_metrics`` (the frontend's: Requests2XX, QueueTime, ...) and ``model_metrics``
(the handler's: HandlerTime, PredictionTime and any custom metric a handler adds), each a mapping
of ``counter``/``gauge``/``histogram`` to a list of ``{name, unit, dimensions}``. A model metric
always gets the dimension ``Hostname`` last, as TorchServe adds it. A metric left out does not
exist; a handler metric not listed is dropped unless ``model_metrics_auto_detect`` registers it
on first sight (``MetricsSpec.detect``).

The file is read with ``yaml.safe_load`` only. TorchServe's snakeyaml refuses a key it does not
know and then runs with no metrics at all; here any unknown key, or a value of the wrong shape,
is a start-up error naming it. Torch-free.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from torchbay.server.errors import ConfigError

KINDS = ("counter", "gauge", "histogram")
# The units TorchServe's backend writes for a handler's unit (ts/metrics/unit.py): what an
# auto-detected metric is named with in model_metrics.log.
UNITS = {
    "ms": "Milliseconds",
    "s": "Seconds",
    "percent": "Percent",
    "count": "Count",
    "MB": "Megabytes",
    "GB": "Gigabytes",
    "kB": "Kilobytes",
    "B": "Bytes",
    "": "unit",
}
GROUPS = ("ts_metrics", "model_metrics")
# The three families that ``legacy`` mode still publishes on /metrics (observe.ts_families).
LEGACY = frozenset(
    (
        "ts_inference_requests_total",
        "ts_inference_latency_microseconds",
        "ts_queue_latency_microseconds",
    )
)
# The host metrics: torchbay's host collector (observe.system_metrics) publishes them on /metrics
# while system metrics are on, whatever ``ts_metrics`` lists.
HOST_METRICS = frozenset(
    (
        "CPUUtilization",
        "MemoryUsed",
        "MemoryAvailable",
        "MemoryUtilization",
        "DiskUsage",
        "DiskUtilization",
        "DiskAvailable",
        "GPUMemoryUtilization",
        "GPUMemoryUsed",
        "GPUUtilization",
    )
)
# Prometheus' names (text format 0.0.4): a metric's, and a label's (``__`` prefix reserved).
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

DEFAULT_YAML = """
dimensions:
  - &model_name "ModelName"
  - &worker_name "WorkerName"
  - &level "Level"
  - &device_id "DeviceId"
  - &hostname "Hostname"
ts_metrics:
  counter:
    - {name: Requests2XX, unit: Count, dimensions: [*level, *hostname]}
    - {name: Requests4XX, unit: Count, dimensions: [*level, *hostname]}
    - {name: Requests5XX, unit: Count, dimensions: [*level, *hostname]}
    - {name: ts_inference_requests_total, unit: Count,
       dimensions: ["model_name", "model_version", "hostname"]}
    - {name: ts_inference_latency_microseconds, unit: Microseconds,
       dimensions: ["model_name", "model_version", "hostname"]}
    - {name: ts_queue_latency_microseconds, unit: Microseconds,
       dimensions: ["model_name", "model_version", "hostname"]}
  gauge:
    - {name: QueueTime, unit: Milliseconds, dimensions: [*level, *hostname]}
    - {name: WorkerThreadTime, unit: Milliseconds, dimensions: [*level, *hostname]}
    - {name: WorkerLoadTime, unit: Milliseconds, dimensions: [*worker_name, *level, *hostname]}
    - {name: CPUUtilization, unit: Percent, dimensions: [*level, *hostname]}
    - {name: MemoryUsed, unit: Megabytes, dimensions: [*level, *hostname]}
    - {name: MemoryAvailable, unit: Megabytes, dimensions: [*level, *hostname]}
    - {name: MemoryUtilization, unit: Percent, dimensions: [*level, *hostname]}
    - {name: DiskUsage, unit: Gigabytes, dimensions: [*level, *hostname]}
    - {name: DiskUtilization, unit: Percent, dimensions: [*level, *hostname]}
    - {name: DiskAvailable, unit: Gigabytes, dimensions: [*level, *hostname]}
    - {name: GPUMemoryUtilization, unit: Percent, dimensions: [*level, *device_id, *hostname]}
    - {name: GPUMemoryUsed, unit: Megabytes, dimensions: [*level, *device_id, *hostname]}
    - {name: GPUUtilization, unit: Percent, dimensions: [*level, *device_id, *hostname]}
model_metrics:
  gauge:
    - {name: HandlerTime, unit: ms, dimensions: [*model_name, *level]}
    - {name: PredictionTime, unit: ms, dimensions: [*model_name, *level]}
"""


@dataclass(frozen=True)
class MetricSpec:
    """One metric: its name, ``kind`` (counter, gauge or histogram), unit and dimension names."""

    name: str
    kind: str
    unit: str
    dimensions: tuple[str, ...]


class MetricsSpec:
    """The frontend and the model metrics of one config; ``detect`` adds model metrics."""

    def __init__(
        self,
        frontend: dict[str, MetricSpec],
        model: dict[str, MetricSpec],
        *,
        auto_detect: bool = False,
        max_detected: int = 100,
    ) -> None:
        self.frontend = frontend
        self.model = model
        self.auto_detect = auto_detect
        self._room = max_detected  # auto-detected names come from handlers: keep them bounded

    def model_metric(
        self, name: str, kind: str, unit: str, dims: list[str], *, prometheus: bool = False
    ) -> MetricSpec | None:
        """The model metric ``name``; one first seen here when auto-detect is on (its type, unit
        and dimensions as the handler sent them, plus Hostname), else None (dropped). Never
        detected: a frontend metric's name, and with ``prometheus`` (it would be published on
        /metrics) a name or dimension that Prometheus cannot write (``prometheus_problem``)."""
        spec = self.model.get(name)
        if spec is not None or not self.auto_detect or self._room <= 0 or kind not in KINDS:
            return spec
        spec = MetricSpec(name, kind, UNITS.get(unit, unit), (*dims, "Hostname"))
        if name in self.frontend or (prometheus and prometheus_problem(spec) is not None):
            return None
        self._room -= 1
        self.model[name] = spec
        return spec


def prometheus_problem(spec: MetricSpec) -> str | None:
    """Why ``spec`` cannot be a Prometheus family (its name, a dimension's), or None. Such a
    family would make every scrape unparseable; TorchServe's Prometheus client refuses it too."""
    if not _METRIC_NAME.fullmatch(spec.name):
        return f"{spec.name!r} is not a Prometheus metric name"
    for dim in spec.dimensions:
        reserved = dim.startswith("__") or (dim == "le" and spec.kind == "histogram")
        if reserved or not _LABEL_NAME.fullmatch(dim):
            return f"dimension {dim!r} is not a Prometheus label name"
    if len(set(spec.dimensions)) != len(spec.dimensions):
        return "a dimension is named twice (Hostname is added to a model metric)"
    return None


def check_published(spec: MetricsSpec, mode: str, *, host: bool = False) -> None:
    """ConfigError naming the first metric that ``mode`` publishes on /metrics (``prometheus``:
    all; ``legacy``: LEGACY) but Prometheus cannot name (``prometheus_problem``), or that both
    groups declare (two families of one name: TorchServe's registry refuses the second), or, with
    ``host`` (system metrics on), a model metric named as a host metric (HOST_METRICS)."""
    if mode == "log":
        return
    for group, metrics in (("ts_metrics", spec.frontend), ("model_metrics", spec.model)):
        for metric in metrics.values():
            published = mode == "prometheus" or metric.name in LEGACY
            problem = prometheus_problem(metric) if published else None
            if published and group == "model_metrics" and metric.name in spec.frontend:
                problem = f"{metric.name!r} is a ts_metrics name too"
            if published and group == "model_metrics" and host and metric.name in HOST_METRICS:
                problem = f"{metric.name!r} is a host metric (disable_system_metrics=false)"
            if problem is not None:
                raise _fail(f"{group}.{metric.kind}", f"{problem} (metrics_mode={mode})")


def _fail(where: str, message: str) -> ConfigError:
    return ConfigError(
        f"metrics_config {where}: {message}" if where else f"metrics_config: {message}"
    )


def _metric(where: str, kind: str, entry: Any, model: bool) -> MetricSpec:
    if not isinstance(entry, dict):
        raise _fail(where, "each metric is a mapping with name, unit and dimensions")
    unknown = sorted(set(entry) - {"name", "unit", "dimensions"})
    if unknown:
        raise _fail(where, f"unknown key {unknown[0]!r} (known: name, unit, dimensions)")
    name, unit, dims = entry.get("name"), entry.get("unit", ""), entry.get("dimensions") or []
    if not isinstance(name, str) or not name.strip():
        raise _fail(where, "a metric without a name")
    if not isinstance(unit, str) or not isinstance(dims, list):
        raise _fail(f"{where} {name}", "unit is a string and dimensions a list")
    if not all(isinstance(d, str) and d for d in dims) or len(set(dims)) != len(dims):
        raise _fail(f"{where} {name}", "dimensions are distinct non-empty strings")
    dims = [*dims, "Hostname"] if model else dims
    return MetricSpec(name, kind, unit, tuple(dims))


def _group(group: str, value: Any) -> dict[str, MetricSpec]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(group, "a mapping of counter, gauge and histogram")
    unknown = sorted(set(value) - set(KINDS))
    if unknown:
        raise _fail(group, f"unknown key {unknown[0]!r} (known: {', '.join(KINDS)})")
    out: dict[str, MetricSpec] = {}
    for kind in KINDS:
        entries = value.get(kind) or []
        if not isinstance(entries, list):
            raise _fail(f"{group}.{kind}", "a list of metrics")
        for entry in entries:
            spec = _metric(f"{group}.{kind}", kind, entry, group == "model_metrics")
            out[spec.name] = spec  # a name listed twice: the last wins, as in TorchServe
    return out


def parse_metrics_config(text: str, *, auto_detect: bool = False) -> MetricsSpec:
    """A metrics config's text as a :class:`MetricsSpec`; ConfigError names what is wrong."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "bad YAML"
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise _fail("", f"not valid YAML{at} ({first})") from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise _fail("", "not valid YAML (nested too deep)") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise _fail("", "a mapping of dimensions, ts_metrics and model_metrics")
    unknown = sorted(set(data) - {"dimensions", *GROUPS}, key=str)
    if unknown:
        raise _fail("", f"unknown key {unknown[0]!r} (known: dimensions, {', '.join(GROUPS)})")
    if not isinstance(data.get("dimensions") or [], list):
        raise _fail("dimensions", "a list of names")
    return MetricsSpec(
        _group("ts_metrics", data.get("ts_metrics")),
        _group("model_metrics", data.get("model_metrics")),
        auto_detect=auto_detect,
    )


def handler_metrics(spec: MetricsSpec) -> tuple[tuple[str, str, str, tuple[str, ...]], ...]:
    """``model_metrics`` as a handler's metrics cache holds them from the start (TorchServe's
    backend reads the same file: ``get_metric`` finds them): (name, kind, unit, dimensions),
    the dimensions as the file lists them (without the Hostname added here)."""
    return tuple(
        (m.name, m.kind, m.unit, m.dimensions[:-1]) for m in spec.model.values() if m.dimensions
    )


def load_metrics_config(path: Path | None, *, auto_detect: bool = False) -> MetricsSpec:
    """The config at ``path`` (None: TorchServe's default, ``DEFAULT_YAML``)."""
    if path is None:
        return parse_metrics_config(DEFAULT_YAML, auto_detect=auto_detect)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"metrics_config file not found: {Path(path).name}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read metrics_config {Path(path).name}: {exc}") from None
    return parse_metrics_config(text, auto_detect=auto_detect)
