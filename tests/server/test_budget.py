"""The host budget of CPU threads (serving/budget.py): the rule, and how it re-tunes workers."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pytest

from torchbay.server.serving.budget import Demand, HostBudget, plan
from torchbay.server.serving.launch import Placement


def cpu(model: str, index: int, **kw: Any) -> Demand:
    return Demand(model=model, index=index, **kw)


def threads(result: Any) -> dict[tuple[str, int], int]:
    return {k: s.threads for k, s in result.shares.items()}


def test_two_models_two_workers_share_two_cores() -> None:
    # The row: 2 models x 2 workers on 2 cores. More workers than threads: each takes
    # the floor of 1, and the plan says the host is overcommitted (4 > 2).
    result = plan([cpu(m, i) for m in ("a/1", "b/1") for i in (0, 1)], 2, (0, 1))
    assert set(threads(result).values()) == {1}
    assert result.assigned == 4 and result.overcommitted


def test_fair_shares_with_remainder_sum_to_the_budget() -> None:
    result = plan([cpu("a/1", 0), cpu("a/1", 1), cpu("b/1", 0)], 8, tuple(range(8)))
    assert threads(result) == {("a/1", 0): 3, ("a/1", 1): 3, ("b/1", 0): 2}
    assert result.assigned == 8 and not result.overcommitted


def test_one_worker_takes_the_whole_budget() -> None:
    assert threads(plan([cpu("a/1", 0)], 6, tuple(range(16)))) == {("a/1", 0): 6}


def test_explicit_threads_are_honoured_and_counted() -> None:
    demands = [cpu("a/1", 0, configured=3), cpu("b/1", 0), cpu("b/1", 1)]
    result = plan(demands, 8, tuple(range(8)))
    assert threads(result) == {("a/1", 0): 3, ("b/1", 0): 3, ("b/1", 1): 2}
    assert result.assigned == 8


def test_explicit_threads_past_the_budget_overcommit() -> None:
    result = plan([cpu("a/1", 0, configured=6), cpu("b/1", 0)], 4, tuple(range(4)))
    assert threads(result) == {("a/1", 0): 6, ("b/1", 0): 1}
    assert result.overcommitted and result.assigned == 7


def test_gpu_workers_take_one_thread_outside_the_budget() -> None:
    demands = [cpu("g/1", 0, gpu=True), cpu("g/1", 1, gpu=True), cpu("c/1", 0)]
    result = plan(demands, 4, tuple(range(4)))
    assert threads(result) == {("g/1", 0): 1, ("g/1", 1): 1, ("c/1", 0): 4}
    assert result.assigned == 4 and not result.overcommitted
    assert result.shares[("g/1", 0)].cpu_affinity is None


def test_affinity_is_disjoint_across_models() -> None:
    demands = [cpu(m, i, affinity=True) for m in ("a/1", "b/1") for i in (0, 1)]
    result = plan(demands, 8, tuple(range(8)))
    sets = [set(s.cpu_affinity or ()) for s in result.shares.values()]
    assert [len(s) for s in sets] == [2, 2, 2, 2]
    assert set().union(*sets) == set(range(8))  # four disjoint pairs cover the eight cores


def test_affinity_uses_the_usable_core_ids() -> None:
    demands = [cpu("a/1", 0, affinity=True), cpu("b/1", 0, affinity=True)]
    result = plan(demands, 4, (2, 3, 6, 7))
    assert [s.cpu_affinity for s in result.shares.values()] == [(2, 3), (6, 7)]


def test_affinity_only_for_models_that_ask_and_none_when_covering_all() -> None:
    result = plan([cpu("a/1", 0, affinity=True), cpu("b/1", 0)], 4, tuple(range(4)))
    assert result.shares[("a/1", 0)].cpu_affinity == (0, 1)
    assert result.shares[("b/1", 0)].cpu_affinity is None
    alone = plan([cpu("a/1", 0, affinity=True)], 4, tuple(range(4)))
    assert alone.shares[("a/1", 0)].cpu_affinity is None  # all cores: no pinning


# -- HostBudget on live-shaped objects (the slots and workers of serving/) ----------------------


@dataclass
class FakeWorker:  # the I/O seam: WorkerProcess.tune writes a Tune frame
    alive: bool = True
    tuned: list[tuple[int, list[int] | None]] = field(default_factory=list)
    load: Any = None

    def tune(self, n: int, cores: list[int] | None = None) -> None:
        self.tuned.append((n, cores))
        self.load = _Load(n, cores)


@dataclass
class FakeSlot:
    index: int
    placement: Placement
    worker: FakeWorker | None = None
    retiring: bool = False
    gave_up: bool = False


@dataclass
class FakeConfig:
    cpu_threads: int | None = None
    cpu_affinity: bool = False


@dataclass
class FakeVersion:
    key: str
    slots: list[FakeSlot] = field(default_factory=list)
    config: FakeConfig = field(default_factory=FakeConfig)


class _Load:  # the fields of protocol.Load that the budget reads
    def __init__(self, n: int, cores: list[int] | None = None) -> None:
        self.num_threads, self.cpu_affinity = n, cores


def start(budget: HostBudget, versions: list[FakeVersion], mv: FakeVersion) -> FakeSlot:
    index = len(mv.slots)
    share = budget.place(versions, mv, index)
    slot = FakeSlot(index, Placement(None, share.threads, share.cpu_affinity))
    worker = FakeWorker()
    worker.load = _Load(share.threads)
    slot.worker = worker
    mv.slots.append(slot)
    return slot


def test_placing_a_second_model_retunes_the_first() -> None:
    budget = HostBudget(None, (0, 1, 2, 3))
    a, b = FakeVersion("a/1"), FakeVersion("b/1")
    first = start(budget, [a], a)
    assert first.placement.threads == 4
    second = start(budget, [a, b], b)
    assert (first.placement.threads, second.placement.threads) == (2, 2)
    assert first.worker is not None and first.worker.tuned == [(2, None)]
    assert budget.summary() == {"budget": 4, "assigned": 4, "overcommitted": False, "cores": 4}


def test_removing_a_model_gives_its_threads_back() -> None:
    budget = HostBudget(6, tuple(range(8)))
    a, b = FakeVersion("a/1"), FakeVersion("b/1")
    start(budget, [a], a)
    start(budget, [a, b], b)
    start(budget, [a, b], b)
    assert [s.placement.threads for s in a.slots + b.slots] == [2, 2, 2]
    budget.rebalance([a])  # b unregistered
    assert a.slots[0].placement.threads == 6
    assert a.slots[0].worker is not None and a.slots[0].worker.tuned[-1] == (6, None)


def test_retiring_and_gpu_slots_are_left_out() -> None:
    budget = HostBudget(4, tuple(range(4)))
    a = FakeVersion("a/1")
    start(budget, [a], a)
    start(budget, [a], a)
    a.slots[1].retiring = True
    gpu = FakeSlot(2, Placement(0, 1))
    a.slots.append(gpu)
    budget.rebalance([a])
    assert a.slots[0].placement.threads == 4
    assert gpu.placement == Placement(0, 1)


def test_a_worker_still_loading_is_not_tuned_but_caught_up_later() -> None:
    budget = HostBudget(2, (0, 1))
    a, b = FakeVersion("a/1"), FakeVersion("b/1")
    slot = start(budget, [a], a)
    assert slot.worker is not None
    slot.worker.alive = False  # loading with 2 threads
    start(budget, [a, b], b)
    assert slot.placement.threads == 1 and slot.worker.tuned == []
    slot.worker.alive = True  # ready: the rebalance after its model's start re-tunes it
    budget.rebalance([a, b])
    assert slot.worker.tuned == [(1, None)]


def test_overcommit_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    budget = HostBudget(1, (0,))
    a = FakeVersion("a/1")
    with caplog.at_level(logging.WARNING, logger="torchbay.budget"):
        start(budget, [a], a)
        start(budget, [a], a)
        start(budget, [a], a)
        budget.rebalance([a])
    warnings = [r for r in caplog.records if "overcommitted" in r.getMessage()]
    assert len(warnings) == 1
    assert budget.summary() == {"budget": 1, "assigned": 3, "overcommitted": True, "cores": 1}


def test_a_disabled_budget_changes_nothing() -> None:
    budget = HostBudget(None, (), enabled=False)
    a = FakeVersion("a/1", [FakeSlot(0, Placement(None, 7), FakeWorker())])
    budget.rebalance([a])
    assert a.slots[0].placement.threads == 7 and budget.summary() is None


def test_affinity_is_recomputed_when_a_model_joins() -> None:
    budget = HostBudget(None, (0, 1, 2, 3))
    a = FakeVersion("a/1", config=FakeConfig(cpu_affinity=True))
    b = FakeVersion("b/1", config=FakeConfig(cpu_affinity=True))
    first = start(budget, [a], a)
    assert first.placement.cpu_affinity is None  # alone on all four cores: not pinned
    second = start(budget, [a, b], b)
    assert first.placement.cpu_affinity == (0, 1) and second.placement.cpu_affinity == (2, 3)
    assert first.worker is not None and first.worker.tuned == [(2, [0, 1])]


def test_serve_flag_sets_the_budget() -> None:
    import argparse

    from torchbay.server import cli

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--cpu-thread-budget", "3"])
    assert cli._cli_settings(args)["cpu_thread_budget"] == 3
    assert "cpu_thread_budget" not in cli._cli_settings(parser.parse_args(["serve"]))
