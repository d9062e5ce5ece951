"""Admission control: a per-model bound on a request's queue time (``max_queue_delay_ms``).

A model version's :class:`Admission` learns its service rate from what its slots observe (each
finished batch: its size and its wall time on the worker, decayed sums), predicts a
newcomer's queue wait from the work ahead of it and refuses at once, 503 :class:`Overloaded` with
``Retry-After``, when the prediction exceeds the bound.

The prediction counts batches: the newcomer rides in batch ``queued // batch_size`` of those
waiting; its batch starts once the batches ahead have taken the idle workers and, after that,
one worker frees per batch. Workers free at ``workers / t`` per second, ``t`` being the time of a
full batch (fitted as ``a + c * batch_size`` to the recent batches); so the wait is
``max(0, ahead + 1 - idle) * t / workers``, less half a batch when every worker is busy (the
first to free is, on average, half-way through its batch).

The queue enforces the same bound at dispatch (``BatchQueue.max_wait_s``): a request still
queued past ``arrival + bound`` is answered 503 and never runs. Before the first batch has been
measured only the queue's length (``job_queue_size``) limits admission: a cold model never
refuses on a guess.

``Retry-After`` is whole seconds, at least 1 (RFC 9110), from the predicted time to drain the work
ahead. The listeners call :func:`refuse_early` from the request's headers, before reading its
body. While a model version refuses (:attr:`Admission.pressed`: a refusal in the last
``PRESSURE_S``), the inference listener also asks it in the HTTP protocol itself, before any
ASGI task exists (``InferenceApp.at_headers``), so a refusal under overload costs the frontend a
few microseconds rather than a whole request's.

Torch-free; it imports no model code (a model version is passed in, duck-typed).
"""

from __future__ import annotations

import math
from typing import Any

from torchbay.server.errors import NoWorker, Overloaded, ShuttingDown, TorchbayError
from torchbay.server.serving.queue import BatchQueue, clock

__all__ = ["Admission", "any_pressed", "refuse", "refuse_early", "retry_after"]

# Reasons counted by ``Admission.rejections`` (and the torchbay_admission_rejections metric).
PREDICTED, EXPIRED, QUEUE_FULL = "predicted_wait", "expired", "queue_full"
# A model version that refused a request this recently is "pressed" (Admission.pressed).
PRESSURE_S = 1.0
# When any model version of this process last refused (clock()): a one-compare exit for the
# listeners' check at the headers while nothing refuses (several servers in one process, as
# in tests, share it: it only decides whether to look).
_last_refusal = [-math.inf]


def any_pressed() -> bool:
    """Some model version of this process refused a request in the last ``PRESSURE_S``."""
    return clock() - _last_refusal[0] < PRESSURE_S


def retry_after(seconds: float) -> str:
    """A ``Retry-After`` value: whole seconds, at least 1."""
    if not math.isfinite(seconds):
        return "1"
    return str(max(1, math.ceil(seconds)))


class Admission:
    """The queue-time bound of one model version and the service rate it is judged by."""

    def __init__(
        self,
        queue: BatchQueue,
        bound_ms: float,
        *,
        decay: float = 0.8,
    ) -> None:
        self.queue = queue
        self._decay = decay
        # Decayed sums over measured batches (size b, wall time t): 1, b, t, b*b, b*t.
        self._n = self._b = self._t = self._bb = self._bt = 0.0
        # The model's state at the last check (for Retry-After and describe between checks).
        self.workers, self.busy, self.batch_size = 1, 0, 1
        self.predicted = 0  # refusals on a predicted wait (the queue counts the others)
        self.bound_s = 0.0
        self.refused_at = -math.inf  # clock() of the last refusal at admission, for any reason
        queue.retry_after = self.retry_after
        self.configure(bound_ms)

    def configure(self, bound_ms: float | None) -> None:
        """Set the bound live (0: off, None: unchanged); the queue's expiry follows it."""
        if bound_ms is None:
            return
        self.bound_s = max(0.0, bound_ms) / 1000
        self.queue.max_wait_s = self.bound_s

    # -- learning -------------------------------------------------------------------------------

    def learn(self, size: int, run_s: float) -> None:
        """One finished batch of ``size`` requests that kept its worker ``run_s`` seconds."""
        if size <= 0 or run_s <= 0 or not math.isfinite(run_s):
            return
        d = self._decay
        self._n = self._n * d + 1
        self._b = self._b * d + size
        self._t = self._t * d + run_s
        self._bb = self._bb * d + size * size
        self._bt = self._bt * d + size * run_s

    @property
    def rate(self) -> float | None:
        """Requests per second of one worker at the batch sizes seen (None: nothing yet)."""
        return self._b / self._t if self._t > 0 else None

    def batch_time_s(self, size: int) -> float | None:
        """The predicted time of a batch of ``size``: ``a + c * size`` fitted (decayed least
        squares) to the recent batches, so small batches' fixed cost is not multiplied; one
        size seen only: proportional to it. None when nothing is measured yet."""
        n, b, t = self._n, self._b, self._t
        if t <= 0:
            return None
        spread = n * self._bb - b * b
        if spread > 1e-9 * n * n:
            c = max(0.0, (n * self._bt - b * t) / spread)
            a = (t - c * b) / n
            if a >= 0:
                return a + c * size
        return t / b * size  # one size seen, or a negative fixed cost: proportional

    def predicted_wait_s(self, level: int | None = None) -> float:
        """The queue wait of a request admitted now (0 when nothing is measured yet), from
        the state of the last ``check`` and the work queued ahead of it now: with priority
        levels, what waits at ``level`` (0-based) and above (None: the highest level, all a
        caller that has not said its level can be sure of), later levels never taking its
        turn; without, the whole queue."""
        full = self.batch_time_s(self.batch_size)
        if full is None:
            return 0.0
        workers = max(1, self.workers)
        levels = self.queue.levels
        queued = len(self.queue) if levels is None else levels.ahead_of(level or 0)
        ahead = queued // self.batch_size  # whole batches before the newcomer's
        idle = max(0, workers - self.busy)
        releases = max(0.0, ahead + 1.0 - idle)
        if releases and not idle:
            releases -= 0.5  # the first worker to free is, on average, half-way through
        return releases * full / workers

    def retry_after(self) -> str:
        """When to come back: the predicted time to drain the work ahead, >= 1 s."""
        return retry_after(self.predicted_wait_s())

    # -- deciding -------------------------------------------------------------------------------

    def refused(self) -> None:
        """Note a refusal at admission (any reason): the model version is pressed for a while."""
        self.refused_at = _last_refusal[0] = clock()

    @property
    def pressed(self) -> bool:
        """A request was refused at admission in the last ``PRESSURE_S`` (for any reason)."""
        return clock() - self.refused_at < PRESSURE_S

    def check(self, *, workers: int, busy: int, batch_size: int, level: int | None = None) -> None:
        """Raise Overloaded when a newcomer at ``level`` (see ``predicted_wait_s``) is predicted
        to wait past the bound: ``workers`` ready, ``busy`` of them running a batch, batches of
        up to ``batch_size``."""
        self.workers, self.busy, self.batch_size = workers, busy, max(1, batch_size)
        if self.bound_s <= 0:
            return
        wait = self.predicted_wait_s(level)
        if wait > self.bound_s:
            self.predicted += 1
            raise Overloaded(
                f"The model is overloaded: a new request would wait about {wait * 1000:.0f} ms "
                f"in its queue, over its bound of {self.bound_s * 1000:g} ms; retry later",
                headers={"retry-after": retry_after(wait)},
            )

    @property
    def rejections(self) -> dict[str, int]:
        """Refusals so far, by reason."""
        return {
            PREDICTED: self.predicted,
            EXPIRED: self.queue.expired,
            QUEUE_FULL: self.queue.full,
        }

    def describe(self) -> dict[str, Any]:
        rate = self.rate
        return {
            "maxQueueDelayMs": self.bound_s * 1000,
            "serviceRatePerWorker": None if rate is None else round(rate, 3),
            "predictedQueueWaitMs": round(self.predicted_wait_s() * 1000, 3),
            "admissionRejections": self.rejections,
            **({} if self.queue.levels is None else {"queueLevels": self.queue.levels.describe()}),
        }


def refuse(mv: Any, level: int | None = None, load: bool = True, pressure: bool = True) -> None:
    """Raise what a model version refuses a newcomer at ``level`` with at once (None: from the
    headers, the level not yet known): 503 ShuttingDown, NoWorker or Overloaded (the queue's own
    QueueFull comes at ``put``). An on-demand version without a worker is loaded (``load``:
    the request is admitted; not from the headers, as a response cache hit needs no worker);
    not Overloaded without ``pressure``."""
    if mv.closing:
        raise ShuttingDown(stopping_message(mv))
    serving = False
    workers = busy = 0
    for slot in mv.slots:  # one pass: this runs twice per request (see refuse_early)
        serving = serving or slot.may_serve
        if slot.ready:
            workers += 1
            busy += slot.busy  # its batch in hand (one retiring after a scale down: DRAINING)
    if not serving and mv.demand is not None:
        if load:
            mv.demand(mv)  # on demand (serving/multiplex.py): queued while its load runs
    elif not serving:
        raise NoWorker(  # TorchServe 0.12's words, less its sequence-batching advice
            f'Model "{mv.name}" has no worker to serve inference request. '
            "Please use scale workers API to add workers."
        )
    if pressure:  # the batch size the queue runs: the autopilot may run it below the configured one
        mv.admission.check(workers=workers, busy=busy, batch_size=mv.queue.batch_size, level=level)


def stopping_message(mv: Any, state: str = "is stopping", then: str = "") -> str:
    """Why a version that is closing refuses or stops what it did (``then``): it is unregistered
    or the server stops (the version cannot tell which; an unregistration is no shutdown)."""
    return (
        f'Model "{mv.name}" version {mv.version} {state} (unregistered, or the server '
        f"stopping){then}"
    )


def refuse_early(mv: Any, pressure: bool = True) -> None:
    """``refuse`` from the request's headers alone, before its body is read (a listener's
    cheap path); a refusal is counted as a received and rejected request. Without ``pressure``
    (a version whose response cache may answer the request without its queue) only what no
    answer bypasses: a full queue or an overload is left to the queue, after the look-up."""
    try:
        refuse(mv, load=False, pressure=pressure)
        if pressure and mv.queue.remaining_capacity <= 0:
            mv.queue.put_refused()
    except TorchbayError:
        mv.requests_received += 1
        mv.requests_rejected += 1
        mv.admission.refused()
        raise
