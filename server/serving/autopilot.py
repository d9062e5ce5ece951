"""The SLA autopilot: adapts a model version's live batch size and batch delay to a p99 target.

A model version whose ``sla_p99_ms`` is set (``slaP99Ms`` in model-config.yaml or ``models={...}``,
``sla_p99_ms`` in the management API) gets a controller that watches its batches and, once per
window, moves the queue's batch size and batch delay within the configured ceilings
(``batch_size`` and ``max_batch_delay_ms`` stay what was configured; the autopilot changes only
what the queue uses). The control law (docs/autopilot.md):

* a window closes after ``window_s`` of batches holding at least ``min_samples`` requests (with
  priority levels: of one level, the highest so served being judged); its p99 is the
  nearest-rank 99th percentile of each request's queue time plus its batch's service time (its
  wall time on the worker, ``BatchRecord.run_s``);
* over the target: halve the delay (below 1 ms: 0); with no delay left, halve the batch size,
  but only when service time, not queueing, dominates, and not while the workers are ``BUSY``
  with batches that alone fit the target (a queue longer than the capacity is not cured by
  smaller batches, and near capacity smaller batches, which cost more per request, would push
  the load past it: that is admission control's job, and the autopilot holds);
* under ``grow_below`` x target while the queue is building (requests wait longer than a batch
  runs, a batch's worth is waiting, or the arrival rate keeps the workers at least ``BUSY`` of
  the window busy), for ``grow_after`` windows in a row: add 1 to the batch size, and at the
  ceiling add a step to the delay, but only while the observed arrival rate brings at least one
  more request within the longer delay (a delay too short to catch the next arrival only adds
  latency);
* otherwise hold. Shrinking is multiplicative and immediate, growing additive and delayed: the
  band between ``grow_below`` x target and the target is the hysteresis.

Workers are loaded with the configured batch size (the ceiling); the handler's context reports
that one. Batches are never larger, so no worker restarts when the autopilot moves. Decisions are
driven by batch completions (no task: with no traffic there is nothing to decide), logged at INFO
with their reason and exported by observe.autopilot_metrics. Torch-free.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from torchbay.server.serving.launch import ModelSettings
    from torchbay.server.serving.queue import BatchQueue
    from torchbay.server.serving.slot import BatchRecord


class Piloted(Protocol):
    """What the autopilot reads of a model version (serving.model imports this module)."""

    settings: ModelSettings
    queue: BatchQueue[Any, Any]

    @property
    def key(self) -> str: ...

    @property
    def ready_workers(self) -> int: ...


__all__ = ["BUSY", "Autopilot", "Controller", "Decision", "Knobs", "Samples", "Window", "p99"]

log = logging.getLogger("torchbay.autopilot")
BUSY = 0.8  # the workers' busy share of a window from which the queue counts as building


@dataclass(frozen=True)
class Knobs:
    """What the autopilot moves (current) or may not pass (ceilings)."""

    batch_size: int
    delay_ms: float


@dataclass
class Samples:
    """One priority level's requests in a window: each one's latency, the queue and service
    sums beside them (for the means)."""

    latencies_ms: list[float] = field(default_factory=list)
    queue_ms: float = 0.0
    service_ms: float = 0.0


_NO_SAMPLES = Samples()


@dataclass
class Window:
    """What one window saw, each priority level's requests apart (no levels: all are level 0).
    Its judged latencies (``latencies_ms`` and the sums beside them) are those of ``level``:
    :meth:`judge` picks the highest level served often enough to judge, the level admission
    protects, the lower ones being refused first; before that, the highest level served."""

    by_level: dict[int, Samples] = field(default_factory=dict)
    level: int | None = None  # the level judged (0-based); None: the highest served
    served: int = 0  # requests of every level
    batches: int = 0
    busy_s: float = 0.0  # the batches' wall time on workers, summed
    elapsed_s: float = 0.0  # set when the window closes (0: unknown)

    def add(
        self, queue_times_s: list[float], service_ms: float, levels: tuple[int, ...] = ()
    ) -> None:
        """One batch: its requests' queue times, its service time, and (with priority levels)
        each request's level."""
        self.served += len(queue_times_s)
        for q, level in zip(queue_times_s, levels or (0,) * len(queue_times_s), strict=True):
            samples = self.by_level.get(level)
            if samples is None:
                samples = self.by_level[level] = Samples()
            samples.latencies_ms.append(q * 1000 + service_ms)
            samples.queue_ms += q * 1000
            samples.service_ms += service_ms
        self.batches += 1
        self.busy_s += service_ms / 1000

    def judge(self, min_samples: int) -> bool:
        """Judge the highest level with at least ``min_samples`` requests; False when no level
        has that many. A level served more rarely is not judged: a p99 of a few samples means
        nothing, and one high request a minute held every window open (no decision for 20
        minutes) when the highest level seen was the only one that counted."""
        for level in sorted(self.by_level):
            if len(self.by_level[level].latencies_ms) >= min_samples:
                self.level = level
                return True
        return False

    @property
    def _judged(self) -> Samples:
        level = min(self.by_level, default=0) if self.level is None else self.level
        return self.by_level.get(level, _NO_SAMPLES)

    @property
    def latencies_ms(self) -> list[float]:
        return self._judged.latencies_ms

    @property
    def queue_ms(self) -> float:
        return self._judged.queue_ms

    @property
    def service_ms(self) -> float:
        return self._judged.service_ms

    def arrival_rps(self) -> float:
        """Requests served per second of the window: in a steady state, the arrival rate."""
        return self.served / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def utilization(self, workers: int) -> float:
        """The share of the window the workers spent running batches (0: unknown)."""
        return self.busy_s / (self.elapsed_s * workers) if self.elapsed_s > 0 else 0.0


@dataclass(frozen=True)
class Decision:
    """One window's verdict: the knobs to use next and why."""

    knobs: Knobs
    p99_ms: float
    direction: str  # "up", "down" or "hold"
    reason: str
    arrival_rps: float = 0.0  # what the window saw
    utilization: float = 0.0


def p99(values: list[float]) -> float:
    """The nearest-rank 99th percentile (0.0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


@dataclass
class Controller:
    """The control law, pure: feed it windows, it returns decisions (unit-testable)."""

    target_ms: float
    grow_below: float = 0.7
    grow_after: int = 2
    _under: int = 0

    def decide(
        self, window: Window, current: Knobs, ceiling: Knobs, waiting: int, workers: int = 1
    ) -> Decision:
        busy = window.utilization(max(1, workers))
        decision = self._decide(window, current, ceiling, waiting, busy)
        return dataclasses.replace(decision, arrival_rps=window.arrival_rps(), utilization=busy)

    def _decide(
        self, window: Window, current: Knobs, ceiling: Knobs, waiting: int, busy: float
    ) -> Decision:
        est = p99(window.latencies_ms)
        n = len(window.latencies_ms)
        mean_queue = window.queue_ms / n if n else 0.0
        mean_service = window.service_ms / n if n else 0.0
        knobs = Knobs(
            min(current.batch_size, ceiling.batch_size), min(current.delay_ms, ceiling.delay_ms)
        )
        if est > self.target_ms:
            self._under = 0
            return self._shrink(
                knobs,
                est,
                queue_bound=mean_queue > mean_service,
                # near capacity, with batches that alone fit the target
                busy=busy >= BUSY and mean_service < self.target_ms,
            )
        building = mean_queue > mean_service or waiting >= knobs.batch_size or busy >= BUSY
        if est < self.grow_below * self.target_ms and building:
            self._under += 1
            if self._under >= self.grow_after:
                self._under = 0
                rate = window.arrival_rps() if window.elapsed_s > 0 else None
                return self._grow(knobs, ceiling, est, rate)
            return Decision(knobs, est, "hold", "under target, queue building: waiting a window")
        self._under = 0
        why = "within the band" if est >= self.grow_below * self.target_ms else "queue not building"
        return Decision(knobs, est, "hold", why)

    def _shrink(self, k: Knobs, est: float, *, queue_bound: bool, busy: bool) -> Decision:
        if k.delay_ms > 0:
            delay = k.delay_ms / 2 if k.delay_ms / 2 >= 1.0 else 0.0
            return Decision(Knobs(k.batch_size, delay), est, "down", "over target: halve the delay")
        if k.batch_size > 1 and not queue_bound and not busy:
            return Decision(
                Knobs(k.batch_size // 2, 0.0), est, "down", "over target: halve the batch size"
            )
        if queue_bound:
            why = "over target from queueing (load above capacity)"
        elif busy:  # smaller batches cost more per request: the capacity would fall below the load
            why = "over target near capacity (workers busy): a smaller batch would lower it"
        else:
            why = "at the floor"
        return Decision(k, est, "hold", why)

    def _grow(self, k: Knobs, ceiling: Knobs, est: float, arrival_rps: float | None) -> Decision:
        """One step up; ``arrival_rps`` None: the window's length is unknown (no gate)."""
        if k.batch_size < ceiling.batch_size:
            return Decision(
                Knobs(k.batch_size + 1, k.delay_ms),
                est,
                "up",
                "under target, queue building: batch + 1",
            )
        if k.delay_ms < ceiling.delay_ms:
            step = max(1.0, ceiling.delay_ms / 10)
            delay = min(ceiling.delay_ms, k.delay_ms + step)
            if arrival_rps is not None and arrival_rps * delay / 1000 < 1.0:
                why = "under target at the batch ceiling: arrivals too sparse for a longer delay"
                return Decision(k, est, "hold", why)
            return Decision(
                Knobs(k.batch_size, delay), est, "up", "under target, queue building: delay + step"
            )
        return Decision(k, est, "hold", "under target at the ceilings")


class Autopilot:
    """One model version's autopilot: collects windows from its batches, applies decisions."""

    def __init__(
        self,
        model: Piloted,
        *,
        window_s: float = 1.0,
        min_samples: int = 20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self.window_s = window_s
        self.min_samples = min_samples
        self.clock = clock
        self.controller: Controller | None = None
        self.window = Window()
        self.started = clock()
        self.last: Decision | None = None
        self.changes = {"up": 0, "down": 0}

    @property
    def target_ms(self) -> float | None:
        return self.model.settings.sla_p99_ms or None  # None or 0: off

    @property
    def active(self) -> bool:
        return self.target_ms is not None

    def ceiling(self) -> Knobs:
        s = self.model.settings
        return Knobs(s.batch_size, s.max_batch_delay_ms)

    def current(self) -> Knobs:
        """What the queue uses; its delay in ms as set (the queue holds seconds: 3.97 ms reads
        back 3.9700000000000006 unrounded, above a ceiling of 3.97)."""
        q = self.model.queue
        return Knobs(q.batch_size, round(q.max_delay_s * 1000, 9))

    def observe(self, record: BatchRecord) -> None:
        """A batch finished: add it to the window; close the window when it is due."""
        target = self.target_ms
        if target is None:
            self.retargeted()
            return
        if self.controller is None or self.controller.target_ms != target:
            self.controller = Controller(target)
            self.window, self.started = Window(), self.clock()
        service = record.run_s * 1000  # the batch's wall time on its worker
        self.window.add(record.queue_times_s, service, record.levels)
        now = self.clock()
        if now - self.started >= self.window_s and self.window.judge(self.min_samples):
            self.window.elapsed_s = now - self.started
            self._decide()
            self.window, self.started = Window(), now

    def retargeted(self) -> None:
        """The target changed (management API): switched off, the queue is back on the
        configured values at once, not after the next batch (none may come for long)."""
        if self.target_ms is None and self.controller is not None:
            self.controller = None
            self._apply(self.ceiling())

    def _decide(self) -> None:
        assert self.controller is not None
        before = self.current()
        decision = self.controller.decide(
            self.window, before, self.ceiling(), len(self.model.queue), self.model.ready_workers
        )
        self.last = decision
        if decision.knobs == before:
            return
        if decision.direction == "hold":
            # Only clipped to the ceilings: a delay's ms -> s -> ms round trip can read back a
            # hair above the configured one (3.97 -> 3.9700000000000006). No change to count.
            self._apply(decision.knobs)
            return
        self.changes[decision.direction] += 1
        self._apply(decision.knobs)
        log.info(
            "autopilot %s: batch %d -> %d, delay %.1f -> %.1f ms (p99 %.1f ms, target %.1f ms): %s",
            self.model.key,
            before.batch_size,
            decision.knobs.batch_size,
            before.delay_ms,
            decision.knobs.delay_ms,
            decision.p99_ms,
            self.controller.target_ms,
            decision.reason,
        )

    def _apply(self, knobs: Knobs) -> None:
        self.model.queue.configure(batch_size=knobs.batch_size, max_delay_s=knobs.delay_ms / 1000)

    def describe(self) -> dict[str, Any] | None:
        """The autopilot's part of describe-model (None when it is off)."""
        if not self.active:
            return None
        cur, ceiling = self.current(), self.ceiling()
        return {
            "targetP99Ms": self.target_ms,
            "batchSize": cur.batch_size,
            "maxBatchDelay": cur.delay_ms,
            "maxBatchSize": ceiling.batch_size,
            "maxBatchDelayCeiling": ceiling.delay_ms,
            "windowP99Ms": self.last.p99_ms if self.last else None,
            "arrivalRps": self.last.arrival_rps if self.last else None,
            "utilization": self.last.utilization if self.last else None,
            "lastDecision": self.last.reason if self.last else None,
            "changes": dict(self.changes),
        }
