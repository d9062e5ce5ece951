"""TorchServe's metrics as its ``metrics_mode`` publishes them: a Prometheus family each
(``prometheus``), a line each in ``ts_metrics.log`` / ``model_metrics.log`` (``log``), or both
(``legacy``: TorchServe's three ``ts_inference_*`` counters in Prometheus, the rest in the logs).

:class:`TsFamilies` holds one :class:`Family` per metric of the :class:`MetricsSpec` and is fed
events (``update``): a counter adds, a gauge sets, a histogram observes; a log family writes a
line instead, through :class:`MetricsLog` (a writer thread: the event loop only queues a string).
An update whose values do not match the metric's dimensions is dropped, as TorchServe's
``addOrUpdate`` fails on it. Torch-free; imports no prometheus_client.
"""

from __future__ import annotations

import contextlib
import decimal
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torchbay.server.config import metrics_config
from torchbay.server.config.metrics_config import HOST_METRICS, LEGACY, MetricSpec, MetricsSpec
from torchbay.server.observe.logwriter import printable
from torchbay.server.observe.rollover import RollingFile, Rotation

log = logging.getLogger("torchbay.metrics")

# TorchServe 0.12's help texts (its record: tests/data/torchserve_0.12/answers.json).
_LEGACY_HELP = {
    "ts_inference_requests_total": "Total number of inference requests.",
    "ts_inference_latency_microseconds": "Cumulative inference duration in microseconds",
    "ts_queue_latency_microseconds": "Cumulative queue duration in microseconds",
}
# simpleclient's default histogram buckets (TorchServe's PrometheusHistogram uses them).
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
# Label sets kept per family. TorchServe keeps them all, but WorkerLoadTime gets one per worker
# ever started, and recycling (max_requests_per_worker) starts workers without end.
MAX_SAMPLES = 1000
TS_METRICS_LOG, MODEL_METRICS_LOG = "ts_metrics.log", "model_metrics.log"
# Host metrics: observe.system_metrics writes them (when enabled), never an empty family here.
SYSTEM = HOST_METRICS


def java_double(value: float) -> str:
    """``value`` as Java's ``Double.toString`` writes it (TorchServe's log lines): ``1.0``,
    ``0.26``, and scientific ``1.0E7`` / ``1.0E-4`` outside [1e-3, 1e7)."""
    value = float(value)
    if value == 0 or 1e-3 <= abs(value) < 1e7 or value != value or abs(value) == float("inf"):
        text = repr(value)
        return {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}.get(text, text)
    number = decimal.Decimal(repr(value))
    digits = "".join(map(str, number.as_tuple().digits)).rstrip("0") or "0"
    sign = "-" if value < 0 else ""
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{number.adjusted()}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    """A HELP text as text format 0.0.4 escapes it: backslash and line feed."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _go(value: float) -> str:
    if value != value:  # a handler's gauge may be NaN; Inf and -Inf as Go writes them
        return "NaN"
    if abs(value) == float("inf"):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if value != int(value) or abs(value) >= 1e15 else f"{value:.1f}"


class MetricsLog:
    """``ts_metrics.log`` and ``model_metrics.log`` in ``directory``, written by one thread in
    bursts (log4j's ``%d{ISO8601} - %m`` lines), rolled over as the other log files are;
    ``put`` only queues."""

    def __init__(self, directory: Path, rotation: Rotation = Rotation()) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._files = {
            name: RollingFile(directory / name, rotation)
            for name in (TS_METRICS_LOG, MODEL_METRICS_LOG)
        }
        self._queue: queue.SimpleQueue[tuple[str, float, str] | None] = queue.SimpleQueue()
        self._failed: set[str] = set()  # the files whose writes failed (warned once)
        self._thread = threading.Thread(
            target=self._write, name="torchbay-metrics-log", daemon=True
        )
        self._thread.start()

    def put(self, file_name: str, message: str) -> None:
        self._queue.put((file_name, time.time(), message))

    def _write(self) -> None:
        while True:
            batch = [self._queue.get()]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            texts: dict[str, list[str]] = {}
            for item in batch:
                if item is None:
                    continue
                name, stamp, message = item
                when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(stamp))
                texts.setdefault(name, []).append(
                    f"{when},{int(stamp % 1 * 1000):03d} - {message}\n"
                )
            for name, lines in texts.items():
                self._write_file(name, "".join(lines))
            if None in batch:
                return

    def _write_file(self, name: str, text: str) -> None:
        """Append ``text`` to ``name``; a write that fails (a full disk) loses those lines, with
        one warning per file, and the thread writes on (a dead writer would leave ``put``
        queueing without end)."""
        try:
            self._files[name].write_text(text)
            self._files[name].flush()
        except (OSError, ValueError) as exc:
            if name not in self._failed:
                self._failed.add(name)
                log.warning("cannot write %s (%s): metrics lines lost", name, exc)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(5)
        for handle in self._files.values():
            with contextlib.suppress(OSError, ValueError):  # what is left to flush is lost
                handle.close()


class Family:
    """One of TorchServe's metrics: its samples (Prometheus) or its log file (``log`` set)."""

    __slots__ = ("adds", "help", "log", "refused", "samples", "size", "spec", "width")

    def __init__(self, spec: MetricSpec, log: Callable[[str], None] | None) -> None:
        self.spec = spec
        self.log = log
        self.width = len(spec.dimensions)
        self.samples: dict[tuple[str, ...], list[float]] = {}
        kind = "counter" if spec.name in LEGACY else spec.kind
        # Decided once, not per event (a request updates about six families).
        self.adds = kind == "counter"
        self.size = len(BUCKETS) + 2 if kind == "histogram" else 1
        self.refused = False  # an increment was dropped (said once)
        self.help = _LEGACY_HELP.get(
            spec.name, _escape_help(f"Torchserve prometheus {kind} metric with unit: {spec.unit}")
        )

    def update(self, values: tuple[str, ...], value: float, request_ids: str | None = None) -> None:
        if len(values) != self.width:
            return  # TorchServe's addOrUpdate fails on a dimension count it was not built for
        if self.adds and not 0 <= value < math.inf:  # a counter never goes down, nor to NaN
            self._refuse(value)  # nor is it logged: TorchServe's backend refuses it there too
            return
        if self.log is not None:
            self.log(self._line(values, value, request_ids))
            return
        state = self.samples.get(values)
        if state is None:
            if len(self.samples) >= MAX_SAMPLES:  # the oldest label set goes (a worker long gone)
                del self.samples[next(iter(self.samples))]
            state = self.samples[values] = [0.0] * self.size
        if self.adds:
            state[0] += value
        elif self.size == 1:  # a gauge
            state[0] = value
        else:  # histogram: per-bucket counts, then the count, then the sum
            for i, bound in enumerate(BUCKETS):
                if value <= bound:
                    state[i] += 1
            state[-2] += 1
            state[-1] += value

    def _refuse(self, value: float) -> None:
        """A counter's increment Prometheus cannot take (negative, NaN, infinite): dropped, as
        TorchServe's client refuses it; said once per family."""
        if not self.refused:
            self.refused = True
            log.warning(
                "metric %s: increment %r dropped (a counter only grows)", self.spec.name, value
            )

    def _line(self, values: tuple[str, ...], value: float, request_ids: str | None) -> str:
        # TorchServe's LogMetric: every dimension but the last (the host) as Name:value.
        dims = ",".join(
            f"{n}:{v}" for n, v in zip(self.spec.dimensions[:-1], values[:-1], strict=True)
        )
        rid = "" if request_ids is None else f",requestID:{request_ids}"
        stamp = int(time.time())
        return printable(
            f"{self.spec.name}.{self.spec.unit}:{java_double(value)}|#{dims}"
            f"|#hostname:{values[-1]}{rid},timestamp:{stamp}"
        )

    def text(self, only: set[str] | None = None) -> list[str]:
        """The family in Prometheus text format 0.0.4: its HELP and TYPE even before a sample,
        as TorchServe's registry writes them (host metrics excepted: see ``SYSTEM``). With
        ``only`` (``name[]``), only the samples named there (``LatH_count``: a histogram's family
        name names none), and nothing without one, as TorchServe's registry filters."""
        if self.log is not None or (not self.samples and self.spec.name in SYSTEM):
            return []
        name, names = self.spec.name, self.spec.dimensions
        kind = "counter" if name in LEGACY else self.spec.kind
        lines = []
        for values, state in list(self.samples.items()):
            # Each label ends with a comma, the last one too (``{Level="Host",Hostname="h",}``),
            # as TorchServe's Prometheus client writes them and TorchServe's own Postman
            # collection matches; Prometheus's parsers read it.
            labels = "".join(f'{k}="{_escape(v)}",' for k, v in zip(names, values, strict=True))
            if kind != "histogram":
                lines.append(f"{name}{{{labels}}} {_go(state[0])}")
                continue
            counts = [*state[: len(BUCKETS)], state[-2]]
            for bound, count in zip((*BUCKETS, float("inf")), counts, strict=True):
                lines.append(f'{name}_bucket{{{labels}le="{_go(bound)}",}} {_go(count)}')
            lines.append(f"{name}_count{{{labels}}} {_go(state[-2])}")
            lines.append(f"{name}_sum{{{labels}}} {_go(state[-1])}")
        if only is not None:
            lines = [line for line in lines if line[: line.index("{")] in only]
            if not lines:
                return []
        return [f"# HELP {name} {self.help}", f"# TYPE {name} {kind}", *lines]


class TsFamilies:
    """Every metric of ``spec``, published as ``mode`` says (``log`` writes through ``log``)."""

    def __init__(self, spec: MetricsSpec, mode: str, hostname: str, log: MetricsLog | None) -> None:
        self.spec = spec
        self.mode = mode
        self.hostname = hostname
        self.log = log
        self.frontend = {name: self._family(s, TS_METRICS_LOG) for name, s in spec.frontend.items()}
        self.model = {name: self._family(s, MODEL_METRICS_LOG) for name, s in spec.model.items()}
        # Whether torchbay's own registry writes this family or sample name on /metrics
        # (observe.metrics wires it to the custom metrics'): auto-detect leaves such a name
        # there, as a second family of one name makes Prometheus reject the whole scrape.
        self.taken: Callable[[str], bool] = lambda name: False

    def _family(self, spec: MetricSpec, file_name: str) -> Family:
        logged = self.mode == "log" or (self.mode == "legacy" and spec.name not in LEGACY)
        if not logged:
            return Family(spec, None)
        if self.log is None:
            return Family(spec, _discard)
        put = self.log.put
        return Family(spec, lambda line: put(file_name, line))

    def update(self, name: str, values: tuple[str, ...], value: float) -> None:
        """A frontend metric's event (nothing when the config leaves ``name`` out)."""
        family = self.frontend.get(name)
        if family is not None:
            family.update(values, value)

    def model_update(
        self, name: str, kind: str, unit: str, dims: dict[str, str], value: float, rids: str
    ) -> bool:
        """A model metric's event, its values found by dimension name (Hostname added); False
        when the config has no such metric and auto-detect is off or refuses it (a name that
        would clash on /metrics with torchbay's own ``torchbay_*`` families, or that Prometheus
        cannot write: MetricsSpec.model_metric)."""
        family = self.model.get(name)
        if family is None:
            prometheus = self.mode == "prometheus"  # published on /metrics, not logged
            if prometheus and (
                name.startswith("torchbay_") or any(map(self.taken, written_names(name, kind)))
            ):
                return False
            spec = self.spec.model_metric(name, kind, unit, list(dims), prometheus=prometheus)
            if spec is None:
                return False
            family = self.model[name] = self._family(spec, MODEL_METRICS_LOG)
        names = family.spec.dimensions[:-1]
        if len(dims) != len(names) or not all(n in dims for n in names):
            return True  # other dimensions than the metric's: TorchServe's update fails too
        family.update((*(dims[n] for n in names), self.hostname), value, rids)
        return True

    def writes(self, name: str) -> bool:
        """Whether one of these families has ``name`` as its name or one of its samples'
        (a histogram's ``_bucket``, ``_count``, ``_sum``)."""
        if name in self.frontend or name in self.model:
            return True
        base, _, suffix = name.rpartition("_")
        family = self.frontend.get(base) or self.model.get(base)
        return family is not None and family.spec.kind == "histogram" and suffix in _SUFFIXES

    def model_records(self, records: list[dict], rids: str) -> list[dict]:
        """A handler's metric records (handlers.metrics) taken as TorchServe's model metrics;
        returns those the config and auto-detect leave out (torchbay's own registry's)."""
        left = []
        for rec in records:
            try:
                dims = {str(k): str(v) for k, v in (rec.get("dimensions") or {}).items()}
                name, kind, unit = (
                    str(rec["name"]),
                    str(rec.get("type", "counter")),
                    rec.get("unit"),
                )
                value = float(rec["value"])
                if not math.isfinite(value):
                    continue  # TorchServe's frontend cannot parse NaN or Inf: no family has it
                own = rec.get("request_id")  # one request of the batch (handlers.metrics)
                ids = own if isinstance(own, str) and own else rids
                taken = self.model_update(name, kind, str(unit or ""), dims, value, ids)
            except (KeyError, TypeError, ValueError, AttributeError):
                taken = False  # torchbay's registry logs a malformed record once
            if not taken:
                left.append(rec)
        return left

    def text(self, names: set[str] | None = None) -> str:
        """Every Prometheus family in text format 0.0.4 (with ``names``, their samples of those
        names: ``Family.text``)."""
        lines: list[str] = []
        for family in (*self.frontend.values(), *self.model.values()):
            lines += family.text(names)
        return "".join(f"{line}\n" for line in lines)

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None


_SUFFIXES = ("bucket", "count", "sum")


def written_names(name: str, kind: str) -> set[str]:
    """The names a family ``name`` of ``kind`` writes in text format 0.0.4: its own and, for a
    histogram, its samples'."""
    return {name, *(f"{name}_{s}" for s in _SUFFIXES)} if kind == "histogram" else {name}


def _discard(line: str) -> None:
    """A log family without a log directory (tests, an unwritable log dir): nothing written."""


def metrics_options(config: Any, env: Mapping[str, str]) -> dict[str, Any]:
    """ServerMetrics' TorchServe options from the server config: the ``metrics_config`` (its
    errors raise ConfigError), ``metrics_mode`` and, outside ``prometheus`` mode, the log files in
    ``$METRICS_LOCATION`` (TorchServe's), else ``$LOG_LOCATION``, else ``logs``. A directory that
    cannot be written leaves the log families silent, with one warning (as the other logs)."""
    spec = metrics_config.load_metrics_config(
        config.metrics_config, auto_detect=config.model_metrics_auto_detect
    )
    host = not config.disable_system_metrics
    metrics_config.check_published(spec, config.metrics_mode, host=host)
    metrics_log = None
    if config.metrics_mode != "prometheus":
        directory = Path(env.get("METRICS_LOCATION") or env.get("LOG_LOCATION") or "logs")
        try:
            metrics_log = MetricsLog(directory, Rotation.of(config))
        except OSError as exc:
            reason = (exc.strerror or type(exc).__name__).lower()
            log.warning("cannot write metrics logs in %s (%s): none written", directory, reason)
    return {"spec": spec, "mode": config.metrics_mode, "metrics_log": metrics_log}
