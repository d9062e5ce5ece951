"""Triton's trace extension, once for every protocol: the trace settings (REST ``GET``/``POST
/v2[/models/{m}]/trace/setting``, gRPC ``TraceSetting``) and the traces themselves.

The settings are Triton's: ``trace_level`` (a list: ``["OFF"]`` or ``["TIMESTAMPS"]``),
``trace_rate`` (every rate-th request is traced), ``trace_count`` (traces left to take; -1: no
limit), ``log_frequency`` (write every N traces to the next index file; 0: at the end),
``trace_file`` and ``trace_mode``, every value a string as Triton answers them. A model's
settings fall back, one by one, to the global ones; a setting given as null is cleared (a model's
falls back again). The values are checked as Triton's frontends check them, with Triton's error
texts (400). Where Triton silently ignores a request this refuses it instead (400): an unknown
setting, an unknown level, a ``trace_mode`` other than ``triton``; and ``TENSORS`` is refused
(torchbay does not trace tensors). As in Triton, ``trace_file`` is the operator's (the
``trace_file`` server setting): it cannot be changed over the network.

Sampling and counting are Triton's: each setting in force (the global one, and each model's own)
counts the requests that use it and traces every ``trace_rate``-th until ``trace_count`` is used
up; changing a setting starts its count again. Every traced request is one JSON object in the
trace file (``plane/trace_file.py`` writes it, off the event loop) with Triton's names:
``REQUEST_START`` (the request reached the plane), ``QUEUE_START`` (it joined the model's
queue), ``COMPUTE_START`` (a worker took it), ``COMPUTE_END`` (its last response was back in the
frontend), ``REQUEST_END`` (the protocol had answered), in nanoseconds of the monotonic clock.
Torch-free.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from torchbay.server.errors import BadRequest
from torchbay.server.plane.trace_file import TraceFile, Writer

UINT32_MAX, INT32_MAX, MIN_COUNT = (1 << 32) - 1, (1 << 31) - 1, -1
SCALARS = ("trace_rate", "trace_count", "log_frequency")
SETTINGS = ("trace_level", *SCALARS, "trace_file", "trace_mode")
MODE = "triton"
MAX_BUFFERED = 1000  # traces held for a write at the end before they go to the file anyway
_INTEGER = re.compile(r"[+-]?[0-9]+")
MAX_DIGITS = 19  # more significant digits than any setting's value can have


@dataclass(frozen=True)
class Setting:
    """The values of one setting in force (Triton's defaults: off, every 1000th, no limit)."""

    level: bool = False  # TIMESTAMPS on
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""

    def problem(self) -> str | None:
        """Why it cannot trace (Triton's reason), None when it can; off is always valid."""
        if not self.level:
            return None
        if self.rate == 0:
            return "sample rate must be non-zero"
        return "trace file name is not given" if not self.file else None

    def to_json(self) -> dict[str, Any]:
        return {
            "trace_level": ["TIMESTAMPS"] if self.level else ["OFF"],
            "trace_rate": str(self.rate),
            "trace_count": str(self.count),
            "log_frequency": str(self.log_frequency),
            "trace_file": self.file,
            "trace_mode": MODE,
        }


_FIELD = {
    "trace_level": "level",
    "trace_rate": "rate",
    "trace_count": "count",
    "log_frequency": "log_frequency",
}


@dataclass
class Trace:
    """One traced request: its id, the model, and the times the plane saw."""

    id: int
    sampler: Sampler
    model: str
    start_ns: int
    version: str | None = None
    queue_ns: int | None = None
    compute_ns: int | None = None
    responded_ns: int | None = None

    def responded(self) -> None:
        self.responded_ns = time.monotonic_ns()

    def to_json(self, end_ns: int) -> str:
        stamps = [
            ("REQUEST_START", self.start_ns),
            ("QUEUE_START", self.queue_ns),
            ("COMPUTE_START", self.compute_ns),
            ("COMPUTE_END", self.responded_ns),
            ("REQUEST_END", end_ns),
        ]
        version: Any = self.version or ""
        if version.isascii() and version.isdigit():
            version = int(version)  # Triton's versions are numbers; torchbay's "1.0" stays text
        return json.dumps(
            {
                "id": self.id,
                "model_name": self.model,
                "model_version": version,
                "timestamps": [{"name": n, "ns": ns} for n, ns in stamps if ns is not None],
            },
            separators=(",", ":"),
        )


@dataclass
class Sampler:
    """One setting in force and its counts (Triton's ``TraceSetting``)."""

    setting: Setting
    file: TraceFile | None
    sampled: int = 0  # requests counted
    created: int = 0  # traces started
    collected: int = 0  # traces finished
    count: int = field(init=False)  # traces left (-1: no limit)
    buffer: list[str] = field(default_factory=list)
    retired: bool = False  # replaced by a newer setting: its late traces are written at once

    def __post_init__(self) -> None:
        self.count = self.setting.count

    @property
    def tracing(self) -> bool:
        s = self.setting
        return s.level and s.rate > 0 and bool(s.file) and self.count != 0

    def sample(self) -> bool:
        """Count one request; True when it is to be traced."""
        if not self.tracing:
            return False
        self.sampled += 1
        if self.sampled % self.setting.rate:
            return False
        if self.count > 0:
            self.count -= 1
        self.created += 1
        return True

    def collect(self, text: str) -> None:
        """A finished trace: to the next index file every ``log_frequency`` traces, and when
        ``trace_count`` is used up; else held for the end (``flush``)."""
        self.buffer.append(text)
        self.collected += 1
        every = self.setting.log_frequency
        if (every and len(self.buffer) >= every) or (
            self.count == 0 and self.collected == self.created
        ):
            self._write(indexed=True)
        elif self.retired or (not every and len(self.buffer) >= MAX_BUFFERED):
            self.flush()

    def flush(self) -> None:
        """Write what is held (Triton's end of a setting: an index file when ``log_frequency``
        is set, else the trace file)."""
        self._write(indexed=bool(self.setting.log_frequency))

    def _write(self, *, indexed: bool) -> None:
        traces, self.buffer = self.buffer, []
        if traces and self.file is not None:
            (self.file.write_indexed if indexed else self.file.append)(traces)


class Tracer:
    """The trace settings in force, global and per model, and their samplers; one per plane."""

    def __init__(self, trace_file: str = "") -> None:
        self._writer = Writer()
        self._file = TraceFile(trace_file, self._writer) if trace_file else None
        self._default = Setting(file=trace_file)  # the start-up values: what a clear restores
        self._overrides: dict[str, dict[str, Any]] = {}  # "" (global) or a model: its values
        self._global = Sampler(self._default, self._file)
        self._models: dict[str, Sampler] = {}  # the models with settings of their own
        self._ids = itertools.count(1)
        self.active = False  # some setting traces: ``start`` is one attribute read otherwise

    def settings(self, model: str | None, changes: Mapping[str, Any] | None) -> dict[str, Any]:
        """The settings in force for ``model`` (None: the global ones), changed first by
        ``changes`` (the JSON request: a setting to a string, a list, or null). BadRequest with
        Triton's text for a bad value; nothing changes then."""
        if changes is not None:
            self._update(model or "", parse(changes))
        sampler = self._sampler(model or "")
        return {**sampler.setting.to_json(), "trace_count": str(sampler.count)}  # what is left

    def start(self, model: str, started: float) -> Trace | None:
        """A trace for this request to ``model`` (which reached the plane at ``started``, a
        ``perf_counter`` time) when its setting samples it; None otherwise."""
        if not self.active:
            return None
        sampler = self._models.get(model, self._global)
        traced = sampler.sample()
        if sampler.count == 0:
            self._refresh()
        if not traced:
            return None
        start_ns = time.monotonic_ns() - int((time.perf_counter() - started) * 1e9)
        return Trace(next(self._ids), sampler, model, start_ns)

    def finish(self, trace: Trace) -> None:
        """The request has been answered: its trace goes to its setting's file."""
        trace.sampler.collect(trace.to_json(time.monotonic_ns()))

    def close(self) -> None:
        """The server stops: every held trace is written and the trace file closed."""
        for sampler in (self._global, *self._models.values()):
            sampler.flush()
        if self._file is not None:
            self._file.close()
        self._writer.close()

    def _sampler(self, key: str) -> Sampler:
        return self._models.get(key, self._global) if key else self._global

    def _values(self, key: str, overrides: dict[str, Any]) -> Setting:
        base = self._default if not key else self._values("", self._overrides.get("", {}))
        return replace(base, **overrides)

    def _update(self, key: str, changes: dict[str, Any]) -> None:
        overrides = {**self._overrides.get(key, {}), **changes}
        overrides = {k: v for k, v in overrides.items() if v is not None}  # None: cleared
        problem = self._values(key, overrides).problem()
        if problem is not None:
            raise BadRequest(f"Attempting to set invalid trace setting :{problem}")
        if overrides:
            self._overrides[key] = overrides
        else:
            self._overrides.pop(key, None)
        for name in [key] if key else ["", *self._models, *self._overrides]:
            self._rebuild(name)
        self._refresh()

    def _rebuild(self, key: str) -> None:
        """A fresh sampler for ``key`` where its values changed (its counts start again)."""
        old = self._sampler(key) if key in self._models or not key else None
        if key and key not in self._overrides:
            self._models.pop(key, None)
            new = None
        else:
            setting = self._values(key, self._overrides.get(key, {}))
            if old is not None and old.setting == setting:
                return
            new = Sampler(setting, self._file)
            if key:
                self._models[key] = new
            else:
                self._global = new
        if old is not None and old is not new:
            old.retired = True  # its traces still running are written when they finish
            old.flush()

    def _refresh(self) -> None:
        self.active = self._global.tracing or any(s.tracing for s in self._models.values())


def parse(changes: Mapping[str, Any]) -> dict[str, Any]:
    """A settings request (JSON) as the ``Setting`` fields it sets (None: cleared); BadRequest
    with Triton's text for what Triton refuses, and a plain one for what it would ignore."""
    if not isinstance(changes, Mapping):
        raise BadRequest("The trace settings must be a JSON object")
    unknown = sorted(set(changes) - set(SETTINGS))
    if unknown:
        raise BadRequest(f"Unknown trace setting(s) {unknown}: expect {list(SETTINGS)}")
    if "trace_file" in changes:
        raise BadRequest("trace file location can not be updated through network protocol")
    mode = changes.get("trace_mode")
    if mode is not None and mode != MODE and mode != [MODE]:
        raise BadRequest(f"Unsupported trace_mode {mode!r}: torchbay traces in mode 'triton'")
    out: dict[str, Any] = {}
    if "trace_level" in changes:
        out["level"] = _level(changes["trace_level"])
    for name in SCALARS:
        if name in changes:
            out[_FIELD[name]] = _number(name, changes[name])
    return out


def _level(value: Any) -> bool | None:
    if value is None:
        return None
    levels = [value] if isinstance(value, str) else value
    if not isinstance(levels, list) or not levels or not all(isinstance(v, str) for v in levels):
        raise BadRequest("trace_level must be a list of levels: OFF, TIMESTAMPS or TENSORS")
    if "OFF" in levels:
        if len(levels) > 1:
            raise BadRequest("Expect only one trace level 'OFF' is specified")
        return False
    for level in levels:
        if level == "TENSORS":
            raise BadRequest("trace_level TENSORS is not supported: torchbay traces TIMESTAMPS")
        if level != "TIMESTAMPS":
            raise BadRequest(f"Unknown trace_level {level!r}: expect OFF, TIMESTAMPS or TENSORS")
    return True


def _number(name: str, value: Any) -> int | None:
    """``trace_rate`` / ``log_frequency`` (0 to 2^32-1) or ``trace_count`` (-1 to 2^31-1)."""
    if value is None:
        return None
    if isinstance(value, list):
        if len(value) != 1:
            raise BadRequest(f"expect only 1 value for '{name}'")
        value = value[0]
    if not isinstance(value, str):
        raise BadRequest(f"Unable to parse '{name}', expect a string, got: {json.dumps(value)}")
    text = value.strip()
    if not _INTEGER.fullmatch(text):
        raise BadRequest(f"Unable to parse '{name}', got: {value}")
    number = _integer(text)
    low, high = (MIN_COUNT, INT32_MAX) if name == "trace_count" else (0, UINT32_MAX)
    if name == "trace_count" and number < low:
        raise BadRequest(f"Unable to parse '{name}'. Expecting value >= {low}, got: {value}")
    if not low <= number <= high:
        raise BadRequest(
            f"Unable to parse '{name}', value is out of range [ {low}, {high} ], got: {value}"
        )
    return number


def _integer(text: str) -> int:
    """A decimal integer text: its value, or one past the range of every setting when it has
    more digits than any in range (Python's int() refuses texts of over 4300 digits)."""
    if len(text.lstrip("+-").lstrip("0")) <= MAX_DIGITS:
        return int(text)
    return -(1 << 64) if text.startswith("-") else 1 << 64
