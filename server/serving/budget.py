"""One host budget of CPU threads shared by every CPU worker of every model and version.

``plan`` is the pure rule; ``HostBudget`` applies it to the live workers (torch-free):

* the budget is ``cpu_thread_budget`` (config.properties), else the usable cores
  (``os.sched_getaffinity``);
* a model's explicit ``cpu_threads`` (or the server's ``cpu_threads_per_worker``) is honoured as
  configured and counted against the budget; the rest of the budget is shared fairly among the
  other CPU workers (``divmod``: the first ones in (model, slot) order take the remainder);
* when there are more workers than threads left, each takes 1: the host is overcommitted, which is
  logged once (on the change) and shown in describe (``threadBudget``);
* a GPU worker takes nothing from the budget: it runs with 1 intra-op thread (its work is on the
  GPU; the thread only feeds it);
* with ``cpu_affinity: true`` a worker is pinned to ``threads`` cores of its own: one cursor over
  the usable cores for all pinned workers of all models, so the sets are disjoint while the pinned
  threads fit in the cores (past that they wrap around and share);
* every worker runs 1 inter-op thread (``worker/main.py``).

The plan is recomputed when a worker is placed (register, scale up), after a model's start, after
scaling and after unregistering; a live worker whose share changed is re-tuned in place (``Tune``),
never restarted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

log = logging.getLogger("torchbay.budget")

GPU_WORKER_THREADS = 1


@dataclass(frozen=True, slots=True)
class Demand:
    """One worker as the budget sees it."""

    model: str  # "name/version"
    index: int  # the slot index within the model
    gpu: bool = False
    configured: int | None = None  # explicit cpu_threads
    affinity: bool = False

    @property
    def key(self) -> tuple[str, int]:
        return (self.model, self.index)


@dataclass(frozen=True, slots=True)
class Share:
    threads: int
    cpu_affinity: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Plan:
    shares: dict[tuple[str, int], Share]
    budget: int
    assigned: int  # intra-op threads of all CPU workers

    @property
    def overcommitted(self) -> bool:
        return self.assigned > self.budget


def plan(demands: Iterable[Demand], budget: int, cores: Sequence[int]) -> Plan:
    """Each worker's threads and optional cores under one host-wide ``budget``."""
    ordered = sorted(demands, key=lambda d: d.key)
    cpu = [d for d in ordered if not d.gpu]
    explicit = sum(max(1, d.configured) for d in cpu if d.configured is not None)
    fair = [d for d in cpu if d.configured is None]
    base, extra = divmod(max(0, budget - explicit), len(fair)) if fair else (0, 0)
    threads: dict[tuple[str, int], int] = {}
    for i, d in enumerate(fair):
        threads[d.key] = max(1, base + (1 if i < extra else 0))
    for d in cpu:
        if d.configured is not None:
            threads[d.key] = max(1, d.configured)
    shares = {d.key: Share(GPU_WORKER_THREADS) for d in ordered if d.gpu}
    cursor = 0
    for d in cpu:
        n = threads[d.key]
        pinned = None
        if d.affinity and cores and n < len(cores):
            pinned = tuple(cores[(cursor + j) % len(cores)] for j in range(n))
            cursor += n
        shares[d.key] = Share(n, pinned)
    return Plan(shares, budget, sum(threads.values()))


def _live_slots(mv: Any) -> list[Any]:
    return [s for s in mv.slots if not s.retiring and not s.gave_up]


def _demand(mv: Any, index: int, gpu: bool, own: int | None = None) -> Demand:
    """``own``: the threads the worker's handler set itself (they count as configured)."""
    config = mv.config
    return Demand(
        model=mv.key,
        index=index,
        gpu=gpu,
        configured=own or getattr(config, "cpu_threads", None),
        affinity=bool(getattr(config, "cpu_affinity", False)),
    )


def on_gpu(slot: Any) -> bool:
    """The slot's worker was given a GPU and runs there. One given a GPU whose handler runs on
    the CPU (no CUDA for torch in the worker: a CPU build on a GPU host) is a CPU worker here,
    once its Ready said so: the budget gives it a share, as the other CPU workers."""
    if slot.placement.gpu_id is None:
        return False
    return getattr(slot.worker, "device", "cuda") != "cpu"


def own_threads(slot: Any) -> int | None:
    """The intra-op threads the slot's worker's handler set itself, if it did."""
    return getattr(slot.worker, "own_threads", None)


class HostBudget:
    """The server's one budget: places new CPU workers and re-tunes the live ones."""

    def __init__(self, budget: int | None, cores: Sequence[int], *, enabled: bool = True) -> None:
        self.enabled = enabled  # False: a registry without a server (unit tests) re-tunes nothing
        self.cores = tuple(cores)
        self.budget = budget if budget is not None else max(1, len(self.cores))
        self.last = Plan({}, self.budget, 0)

    def _plan(self, versions: Iterable[Any], extra: Demand | None = None) -> Plan:
        demands = [
            _demand(mv, s.index, on_gpu(s), own_threads(s))
            for mv in versions
            for s in _live_slots(mv)
        ]
        if extra is not None:
            demands = [d for d in demands if d.key != extra.key] + [extra]
        result = plan(demands, self.budget, self.cores)
        if result.overcommitted and not self.last.overcommitted:
            log.warning(
                "CPU threads overcommitted: %d intra-op threads assigned, budget %d "
                "(explicit cpu_threads, or more CPU workers than the budget)",
                result.assigned,
                self.budget,
            )
        self.last = result
        return result

    def place(self, versions: Iterable[Any], mv: Any, index: int) -> Share:
        """The share of a CPU worker about to start as slot ``index`` of ``mv``; every other
        live worker is re-tuned to the plan that includes it."""
        versions = list(versions)
        result = self._plan(versions, _demand(mv, index, gpu=False))
        self._apply(versions, result)
        return result.shares[(mv.key, index)]

    def rebalance(self, versions: Iterable[Any]) -> Plan:
        """Recompute the plan over the live workers and re-tune those whose share changed."""
        versions = list(versions) if self.enabled else []
        result = self._plan(versions)
        self._apply(versions, result)
        return result

    def _apply(self, versions: list[Any], result: Plan) -> None:
        for mv in versions:
            for slot in _live_slots(mv):
                share = result.shares.get((mv.key, slot.index))
                if share is None or on_gpu(slot):
                    continue
                _retune(slot, share)

    def summary(self) -> dict[str, Any] | None:
        """For describe: the budget, the threads assigned, whether that passes the budget."""
        if not self.enabled:
            return None
        return {
            "budget": self.budget,
            "assigned": self.last.assigned,
            "overcommitted": self.last.overcommitted,
            "cores": len(self.cores),
        }


def _retune(slot: Any, share: Share) -> None:
    """Record ``share`` as the slot's placement and tell its running worker, if it differs from
    what the worker runs with (a worker that loaded while the plan changed is caught up here)."""
    placement = replace(slot.placement, threads=share.threads, cpu_affinity=share.cpu_affinity)
    slot.placement = placement
    worker = slot.worker
    if worker is None or not worker.alive or own_threads(slot):
        return  # it starts (or restarts) from slot.placement; a handler's own threads stay
    running = (worker.load.num_threads, tuple(worker.load.cpu_affinity or ()) or None)
    if running != (share.threads, share.cpu_affinity):
        worker.tune(share.threads, list(share.cpu_affinity) if share.cpu_affinity else None)
