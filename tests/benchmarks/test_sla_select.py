"""``bench sla``'s honesty, without a server: selection from recorded repeats, the search's ramp,
bisection, pruning and repeats, the repeats' table, the progress lines with an estimate of the
time left, and the report files byte for byte against recorded ones."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from torchbay.benchmarks.loadgen import LoadResult
from torchbay.benchmarks.report import Eta
from torchbay.benchmarks.scenarios import Batching
from torchbay.benchmarks.sla import _Search
from torchbay.benchmarks.sla_model import Outcome, SlaOptions, SlaResult, Step
from torchbay.benchmarks.sla_report import _repeat_lines, render_markdown, write_all
from torchbay.benchmarks.stats import LatencySummary

RECORDED = Path(__file__).parent.parent / "data" / "bench_sla"
FAST = Outcome(Batching(8, 5.0, 1), status="searched", best_rate=900.0)
SLOW = Outcome(Batching(4, 5.0, 1), status="searched", best_rate=700.0)
OPTIONS = SlaOptions(archive=Path("m.mar"), inputs=(Path("x"),), sla_p99_ms=50)


def rep(oc: Outcome, passed: list[bool]) -> Outcome:
    """``oc`` repeated once per ``passed``: p99 40 ms when it held the SLA, 80 when it missed."""
    runs = [
        Step(
            oc.config,
            "repeat",
            oc.best_rate,
            _result(40.0 if ok else 80.0, oc.best_rate - i),
            ok,
            "",
        )
        for i, ok in enumerate(passed)
    ]
    return replace(oc, steps=runs)


def _result(p99_ms: float, ok_per_s: float) -> Any:
    """What the report and the probe read of a step's LoadResult."""
    latency = SimpleNamespace(p50_ms=9.0, p99_ms=p99_ms)
    return SimpleNamespace(ok_per_s=ok_per_s, ok=int(ok_per_s > 0), latency=latency)


def crown(ranked: list[Outcome]) -> tuple[Outcome | None, Outcome | None, str]:
    """The winner, runner-up and note that a result with ``ranked`` as its top two crowns."""
    result = SlaResult(OPTIONS, "m", "1", ranked, ranked)
    return result.winner, result.runner_up, result.note


def test_a_config_that_missed_in_one_repeat_is_not_crowned() -> None:
    """The search's pick held the SLA in 2 of 3 repeats (a median would crown it): the runner-up,
    which held it in all three, wins."""
    fast, slow = rep(FAST, [True, False, True]), rep(SLOW, [True, True, True])
    winner, runner_up, note = crown([fast, slow])
    assert winner is slow and runner_up is fast
    assert FAST.label in note and "cannot win" in note


def test_no_winner_when_every_repeated_config_missed_once() -> None:
    winner, runner_up, note = crown(
        [rep(FAST, [True, True, False]), rep(SLOW, [False, True, True])]
    )
    assert winner is None and runner_up is None
    assert "No repeated configuration held the SLA in every repeat" in note


def test_the_search_pick_stands_when_it_held_every_repeat_or_none_were_run() -> None:
    both = [rep(FAST, [True] * 3), rep(SLOW, [True] * 3)]
    assert crown(both) == (both[0], both[1], "")
    assert crown([FAST, SLOW]) == (FAST, SLOW, "")
    assert crown([]) == (None, None, "")


def test_a_repeat_is_read_back_from_its_steps() -> None:
    """The repeats' rate, p99s and verdicts are the outcome's repeat steps; the search's own
    steps do not count, and before any repeat the rate is the search's best."""
    ramp = Step(FAST.config, "ramp", 450.0, _result(10.0, 450.0), True, "")
    fast = rep(FAST, [True, False])
    fast.steps.insert(0, ramp)
    assert fast.runs == fast.steps[1:] and fast.rate == 900.0
    assert fast.p99_ms == [40.0, 80.0] and fast.ok_per_s == [900.0, 899.0]
    assert fast.passed == [True, False]
    assert replace(FAST, steps=[ramp]).rate == FAST.best_rate == 900.0


def swapped(winner: Outcome, **extra: Any) -> SlaResult:
    """A search whose first pick (FAST) missed the SLA in its second of three repeats, so
    ``winner`` (SLOW's outcome, held in all three) is crowned instead."""
    return SlaResult(
        options=OPTIONS,
        model="m",
        version="1",
        outcomes=[FAST, winner],
        ranked=[rep(FAST, [True, False, True]), winner],
        elapsed_s=1.0,
        **extra,
    )


def test_the_report_shows_every_repeat_and_the_spread() -> None:
    result = swapped(rep(SLOW, [True, True, True]))
    assert result.swapped and result.winner is result.ranked[1] is result.pace
    assert result.note == "b8-d5-w1 missed the SLA in at least one repeat and cannot win."
    text = "\n".join(_repeat_lines(result))
    fast_row = next(line for line in text.splitlines() if line.startswith(f"| {FAST.label} "))
    assert "40.00, 80.00, 40.00" in fast_row  # every repeat
    assert "40.00-80.00" in fast_row  # min-max of p99
    assert "898.0-900.0" in fast_row  # min-max of throughput
    assert "yes MISSED yes" in fast_row and "2/3" in fast_row
    assert "cannot win" in text


def test_progress_lines_estimate_the_time_left() -> None:
    now = [100.0]
    lines: list[str] = []
    progress = Eta(4, lines.append, lambda: now[0])
    now[0] = 110.0
    progress.tick("probed b1-d5-w1")
    now[0] = 120.0
    progress.tick("probed b4-d5-w1")
    assert lines == [
        "progress: 1/4 probed b1-d5-w1; elapsed 10 s, about 30 s left",
        "progress: 2/4 probed b4-d5-w1; elapsed 20 s, about 20 s left",
    ]


def test_progress_drops_units_that_will_not_run() -> None:
    """Fewer configurations met the SLA than planned: their repeats leave the total, so the
    count ends at N/N and the time left shrinks with them."""
    now = [0.0]
    lines: list[str] = []
    progress = Eta(4, lines.append, lambda: now[0])
    now[0] = 10.0
    progress.tick("probed b1-d5-w1")
    progress.drop(2)
    now[0] = 20.0
    progress.tick("autopilot")
    assert lines[-1] == "progress: 2/2 autopilot; elapsed 20 s, about 0 s left"
    progress.drop(5)  # never below what is done
    assert progress.total == 2


def test_the_report_states_the_verdict_and_the_autopilot_as_facts() -> None:
    """A swapped winner: the verdict compares its repeats with the runner-up's, the autopilot's
    runs and end state are one line each, and no fact is printed without a value."""
    best = Step(SLOW.config, "ramp", 700.0, _result(40.0, 698.0), True, "")
    slow = rep(replace(SLOW, best_step=best), [True, True, True])
    result = swapped(
        slow,
        autopilot=replace(rep(FAST, [True]), name="autopilot"),
        autopilot_state={"batchSize": 4, "maxBatchDelay": 2.0, "changes": {"up": 1}},
    )
    lines = render_markdown(result).splitlines()
    assert f"- winner: **{slow.label}**: batch size 4, max batch delay 5 ms, 1 worker(s)" in lines
    assert f"- first pick, missed the SLA in a repeat: {FAST.label}" in lines
    assert "- repeats that held the SLA: winner 3 of 3, runner-up 2 of 3" in lines
    assert "- winner's rate against the runner-up's: -22.2% (repeat spread 0.3%)" in lines
    assert "- autopilot runs that held the SLA: 1 of 1; p99 40.00 ms; 900.0 ok/s" in lines
    assert "- autopilot's end state: batch 4, delay 2.0 ms (1 changes up, 0 down)" in lines
    assert not any(line.endswith(": None") for line in lines)
    assert not any(line.startswith("- too close to call") for line in lines)  # 22% apart


class _Edge(_Search):
    """The search's ramp and bisect against a configuration that holds the SLA up to ``edge``
    req/s: each step passes or breaches by its rate alone (no server)."""

    def __init__(self, edge: float, max_steps: int = 12) -> None:
        self.o = OPTIONS.model_copy(update={"max_steps": max_steps})
        self.edge = edge

    def measure(self, config: Batching, phase: str, rate: float) -> Step:
        ok = rate <= self.edge
        return Step(config, phase, rate, _result(40.0 if ok else 80.0, rate), ok, "")


def test_the_search_ramps_past_the_edge_then_bisects_to_the_precision() -> None:
    outcome = Outcome(FAST.config, capacity=1000.0)
    _Edge(edge=700.0).search(outcome)
    phases = [s.phase for s in outcome.steps]
    assert phases[:2] == ["ramp"] * 2 and set(phases[2:]) == {"bisect"}  # 500 passes, 750 not
    assert outcome.status == "searched" and outcome.best_step is not None
    assert 700.0 / 1.05 <= outcome.best_rate <= 700.0 and outcome.best_step.passed
    breaches = [s.offered_rate for s in outcome.steps if not s.passed]
    assert min(breaches) / outcome.best_rate <= 1.05  # within the precision


def test_the_search_ramps_down_and_gives_up_within_its_budget() -> None:
    low = Outcome(FAST.config, capacity=1000.0)
    _Edge(edge=100.0).search(low)  # 500, 250, 125 breach; 62.5 passes
    assert [s.offered_rate for s in low.steps][:4] == [500.0, 250.0, 125.0, 62.5]
    assert low.status == "searched" and 62.5 <= low.best_rate <= 100.0
    never = Outcome(FAST.config, capacity=1000.0)
    _Edge(edge=0.0, max_steps=3).search(never)
    assert never.status == "infeasible" and len(never.steps) == 3
    assert "breached the SLA even at 125.0 req/s" in never.why
    unbounded = Outcome(FAST.config, capacity=1000.0)
    _Edge(edge=1e9, max_steps=2).search(unbounded)
    assert unbounded.why == "no breach found within the step budget"
    assert unbounded.best_rate == 750.0


class _Grid(_Search):
    """A grid whose configurations each hold the SLA up to their own edge (req/s) and probe at
    1.4x it (no server); ``calls`` records every step in the order it was measured."""

    def __init__(self, edges: dict[str, float], **options: Any) -> None:
        self.o = OPTIONS.model_copy(update=options)
        self.edges, self.lines, self.calls = edges, [], []
        self.log = self.lines.append

    def measure(self, config: Batching, phase: str, rate: float) -> Step:
        edge = self.edges[config.label()]
        self.calls.append((config.label(), phase))
        if phase == "probe":
            return Step(config, phase, 1.4 * edge, _load(1.4 * edge, 30.0), True, "", 2.5, 1.25)
        ok = rate <= edge
        return Step(config, phase, rate, _load(rate, 40.0 if ok else 80.0), ok, "", 2.5, 1.25)


def _load(ok_per_s: float, p99_ms: float) -> LoadResult:
    """A LoadResult of two seconds at ``ok_per_s``, every request a 200, with ``p99_ms`` and the
    other percentiles in fixed ratio to it (all that results.csv and result.json read)."""
    ms = (p99_ms / 3, p99_ms / 4, p99_ms / 2, p99_ms, 1.1 * p99_ms, 1.2 * p99_ms)
    latency, n = LatencySummary(100, *ms), int(2 * ok_per_s)
    counts = ("open", ok_per_s, None, 2.0, n, n, n, {"200": n})
    return LoadResult(*counts, latency, latency, latency, ok_per_s, ok_per_s, [10.0], [])


def test_the_search_measures_each_configuration_once_prunes_and_repeats_the_top_two() -> None:
    """Batch size 1 is measured once whatever its delay; a configuration whose capacity stays
    under the best rate so far after a second probe is skipped; the top two are repeated,
    alternating; the progress count ends at its planned total."""
    edges = {"b1-d2-w1": 100.0, "b4-d2-w1": 850.0, "b4-d5-w1": 380.0, "b8-d2-w1": 900.0}
    edges |= {"b1-d5-w1": 1e9, "b8-d5-w1": 50.0}  # b1-d5 is never measured
    grid = {"batch_sizes": (1, 4, 8), "max_delays_ms": (2.0, 5.0), "repeats": 2}
    search = _Grid(edges, **grid, autopilot=False)
    outcomes, ranked = search.search_all()
    by_label = {oc.label: oc for oc in outcomes}
    assert list(by_label) == [c.label() for c in search.o.configurations()]
    same = by_label["b1-d5-w1"]
    assert same.status == "same-as" and same.same_as is by_label["b1-d2-w1"] and same.steps == []
    assert (same.capacity, same.best_rate) == (140.0, by_label["b1-d2-w1"].best_rate)
    assert all(label != "b1-d5-w1" for label, _ in search.calls)
    skipped = by_label["b4-d5-w1"]  # 532 req/s (+10%) is under b8-d2's ~900
    assert skipped.status == "skipped" and [s.phase for s in skipped.steps] == ["probe"] * 2
    assert "below the best SLA rate so far" in skipped.why and "b8-d2-w1" in skipped.why
    assert [oc.label for oc in ranked] == ["b8-d2-w1", "b4-d2-w1"]
    assert 900 / 1.05 <= ranked[0].best_rate <= 900 and 850 / 1.05 <= ranked[1].best_rate <= 850
    repeats = [label for label, phase in search.calls if phase == "repeat"]
    assert repeats == ["b8-d2-w1", "b4-d2-w1"] * 2  # alternating
    assert all(ranked[0].passed) and len(ranked[1].passed) == 2
    assert SlaResult(search.o, "m", "1", outcomes, ranked).winner is ranked[0]
    progress = [line for line in search.lines if line.startswith("progress: ")]
    assert progress[-1].startswith("progress: 14/14 repeated b4-d2-w1;"), progress


def test_the_report_files_are_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """report.md, results.csv and result.json of a search and an autopilot without a server, the
    machine left out, byte for byte against the recorded ones: folding the report's code must not
    change its files. After a deliberate change, delete tests/data/bench_sla/ and run this twice
    (the first run records them and fails)."""
    edges = {"b1-d2-w1": 100.0, "b1-d5-w1": 1e9, "b4-d2-w1": 850.0, "b4-d5-w1": 820.0}
    options = {"batch_sizes": (1, 4), "max_delays_ms": (2.0, 5.0), "out_dir": tmp_path}
    search = _Grid(edges, **options)
    result = SlaResult(search.o, "m", "1", *search.search_all())
    autopilot = result.autopilot = Outcome(Batching(4, 5.0, 1), best_rate=800.0, name="autopilot")
    search.edges["b4-d5-w1"] = 700.0  # the autopilot at its ceilings
    search.repeat([autopilot], "autopilot", 2)
    result.autopilot_state = {"batchSize": 4, "maxBatchDelay": 2.0, "changes": {"up": 2}}
    result.autopilot_search = Outcome(Batching(4, 5.0, 1))
    search.probe(result.autopilot_search)
    search.search(result.autopilot_search)
    result.elapsed_s = 12.0
    monkeypatch.setattr(sys, "argv", ["torchbay", "bench", "sla", "--sla-p99-ms", "50"])
    write_all(result)
    report = (tmp_path / "report.md").read_text().splitlines(keepends=True)
    written = {
        "report.md": "".join(line for line in report if not line.startswith("- machine: ")),
        "results.csv": (tmp_path / "results.csv").read_text(),
        "result.json": json.loads((tmp_path / "result.json").read_text()),
    }
    written["result.json"].pop("machine")
    written["result.json"] = json.dumps(written["result.json"], indent=2) + "\n"
    if not RECORDED.exists():
        RECORDED.mkdir(parents=True)
        for name, text in written.items():
            (RECORDED / name).write_text(text)
        pytest.fail(f"recorded the report files in {RECORDED}: check them and run again")
    for name, text in written.items():
        assert text == (RECORDED / name).read_text(), name
