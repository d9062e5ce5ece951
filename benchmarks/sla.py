"""``torchbay bench sla``: the batching/worker configuration that serves the most traffic within
a p99 SLA, on one server reconfigured live through the management API (the method: the report's
"How it was found"). The top two are repeated, alternating; then the autopilot runs on a fresh
server at the winner's rate and is searched as a configuration is.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from torchbay.archiver.manifest import read_manifest
from torchbay.benchmarks import sla_report
from torchbay.benchmarks.apply import apply_settings
from torchbay.benchmarks.bench import make_target, observe, warm_up
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.loadgen import LoadGenerator, LoadPlan, LoadResult
from torchbay.benchmarks.managed import Endpoints, ManagedServer, Management, write_properties
from torchbay.benchmarks.report import Eta
from torchbay.benchmarks.scenarios import Batching, models_json
from torchbay.benchmarks.sla_model import Outcome, SlaOptions, SlaResult, Step

Log = Callable[[str], None]
AUTOPILOT = "autopilot"


class _Search:
    """One server's configurations measured, judged and searched; ``progress`` is the run's."""

    def __init__(
        self, options: SlaOptions, endpoints: Endpoints, model: str, gen: LoadGenerator, log: Log
    ) -> None:
        self.o, self.endpoints, self.model, self.gen, self.log = options, endpoints, model, gen, log
        port = endpoints.management_port or 0
        self.mgmt = Management(endpoints.host, port, endpoints.management_key)
        self.target = make_target(endpoints, options, model, None)
        self.current: Batching | None = None
        self.outcomes: list[Outcome] = []  # set by search_all, measured or not
        self.progress = Eta(0, log)  # set by search_all

    def configure(self, config: Batching) -> None:
        """Apply ``config`` live, then warm it up: closed loops at concurrency 1 and 2*b*w, so
        the worker has seen both single requests and full batches before anything is measured
        (TorchScript specializes per input shape on its first calls)."""
        if config == self.current:
            return
        self.mgmt.configure(self.model, None, config)
        self.current = config
        for conc in (1, _full(config)):
            plan = LoadPlan(self.target, "closed", conc, timeout_s=self.o.timeout_s)
            warm_up(self.gen, plan, self.o.config_warmup_s / 2)

    def measure(self, config: Batching, phase: str, rate: float) -> Step:
        """One open-loop step at ``rate`` (or a closed-loop probe when phase is 'probe')."""
        self.configure(config)
        o, probe = self.o, phase == "probe"
        # A step: enough requests for a meaningful p99 at low rates, within a bound.
        duration = o.probe_s if probe else min(max(o.step_s, o.min_requests / rate), 5 * o.step_s)
        timing = {"duration_s": duration, "warmup_s": o.step_warmup_s, "timeout_s": o.timeout_s}
        plan = LoadPlan.of(self.target, _full(config), None if probe else rate, **timing)
        plan = replace(plan, arrival=o.arrival, seed=o.seed)
        result, view = observe(self.gen, self.endpoints, self.model, None, plan, [])
        rate = result.ok_per_s if probe else rate
        batch, queue = (view.mean_batch_size, view.queue_mean_ms) if view else (math.nan, math.nan)
        passed, reason = self.judge(result)
        step = Step(config, phase, rate, result, passed, reason, batch, queue)
        self.log(
            f"  {config.label():<16} {phase:<6} {step.offered_rate:9.1f} req/s -> "
            f"{result.ok_per_s:9.1f} ok/s  p99 {result.latency.p99_ms:8.2f} ms  "
            f"err {100 * result.error_rate:5.2f}%  {'ok' if passed else 'BREACH: ' + reason}"
        )
        return step

    def judge(self, result: LoadResult) -> tuple[bool, str]:
        """A step passes when p99 is within the SLA and errors within the allowed rate."""
        if result.sent == 0 or result.ok == 0:
            return False, "no successful responses"
        if result.error_rate > self.o.max_error_rate:
            return False, f"error rate {100 * result.error_rate:.2f}%"
        if not result.latency.p99_ms <= self.o.sla_p99_ms:
            return False, f"p99 {result.latency.p99_ms:.1f} ms > {self.o.sla_p99_ms:g} ms"
        return True, ""

    def probe(self, outcome: Outcome) -> None:
        step = self.measure(outcome.config, "probe", 0.0)
        outcome.steps.append(step)
        outcome.capacity = step.result.ok_per_s if step.result.ok else 0.0

    def pruned(self, outcome: Outcome, best: Outcome) -> bool:
        """Whether ``outcome`` cannot beat ``best``: its capacity (plus the bound margin) is below
        best's rate. One unlucky probe must not disqualify it: it is probed again first, and the
        better of the two probes counts."""
        margin = 1 + self.o.bound_margin
        if outcome.capacity * margin < best.best_rate:
            first = outcome.capacity
            self.probe(outcome)
            outcome.capacity = max(first, outcome.capacity)
        if outcome.capacity * margin >= best.best_rate:
            return False
        outcome.status = "skipped"
        outcome.why = (
            f"capacity {outcome.capacity:.1f} req/s (+{100 * self.o.bound_margin:g}%) "
            f"is below the best SLA rate so far ({best.best_rate:.1f}, {best.label})"
        )
        self.log(f"  {outcome.label:<16} skipped: {outcome.why}")
        return True

    def repeat(self, outcomes: list[Outcome], phase: str, times: int) -> None:
        """``times`` steps of each outcome at its best rate, alternating between them, so slow
        drift of the machine hits each alike."""
        for _ in range(times):
            for oc in outcomes:
                oc.steps.append(self.measure(oc.config, phase, oc.best_rate))
                self.progress.tick(f"repeated {oc.label}")

    def search(self, outcome: Outcome) -> None:
        """Ramp from half the capacity until a step breaches, then bisect; sets best_rate,
        best_step and status."""
        o = self.o
        cap = outcome.capacity
        if not cap > 0:
            outcome.status, outcome.why = "infeasible", "no successful response in the probe"
            return
        lo: Step | None = None  # the highest passing step so far
        hi: float | None = None  # the lowest breaching rate so far
        rate = 0.5 * cap
        for _ in range(o.max_steps):
            phase = "ramp"
            if lo is not None and hi is not None:  # ramped past the edge: bisect it
                if hi / lo.offered_rate <= 1 + o.precision:
                    break
                rate, phase = math.sqrt(lo.offered_rate * hi), "bisect"
            step = self.measure(outcome.config, phase, rate)
            outcome.steps.append(step)
            if step.passed:
                lo, rate = step, rate * o.ramp_factor
            else:  # without a pass yet, ramp down until one passes
                hi, rate = rate, rate / 2
                if lo is None and rate < cap / 64:
                    break
        if lo is None:
            outcome.status, outcome.why = "infeasible", f"breached the SLA even at {hi:.1f} req/s"
            return
        outcome.status, outcome.best_rate, outcome.best_step = "searched", lo.offered_rate, lo
        outcome.why = (
            f"passes at {lo.offered_rate:.1f}, breaches at {hi:.1f} req/s"
            if hi is not None
            else "no breach found within the step budget"
        )

    def search_all(self) -> tuple[list[Outcome], list[Outcome]]:
        """Every configuration's outcome, and the (at most two) best that met the SLA, best
        first, repeated."""
        o = self.o
        self.outcomes = outcomes = [Outcome(c) for c in self.o.configurations()]
        measured = _distinct(outcomes)
        top = min(2, len(measured))
        # The autopilot's progress units: its runs, its probe and its search.
        pilot = max(1, o.repeats) + 2 if o.autopilot and measured else 0
        self.progress = Eta(2 * len(measured) + o.repeats * top + pilot, self.log)
        self.log(f"probing {len(measured)} configuration(s) (closed loop, {o.probe_s:g} s each)")
        for outcome in measured:
            self.probe(outcome)
            self.progress.tick(f"probed {outcome.label}")
        measured.sort(key=lambda oc: oc.capacity, reverse=True)
        best: Outcome | None = None
        for outcome in measured:
            if o.prune and best is not None and self.pruned(outcome, best):
                self.progress.tick(f"skipped {outcome.label}")
                continue
            self.log(f"searching {outcome.label} (capacity {outcome.capacity:.1f} req/s)")
            self.search(outcome)
            self.progress.tick(f"searched {outcome.label}")
            if outcome.best_step and (best is None or outcome.best_rate > best.best_rate):
                best = outcome
        for outcome in outcomes:
            if src := outcome.same_as:
                outcome.capacity, outcome.best_rate = src.capacity, src.best_rate
                outcome.best_step = src.best_step
        ranked = sorted((oc for oc in measured if oc.best_step), key=lambda oc: -oc.best_rate)[:2]
        # Fewer configurations met the SLA than were planned for: their repeats will not run.
        self.progress.drop(o.repeats * (top - len(ranked)))
        if ranked and o.repeats:
            self.log(f"repeating the top {len(ranked)} configuration(s) {o.repeats} times each")
        self.repeat(ranked, "repeat", o.repeats)
        return outcomes, ranked


def _full(config: Batching) -> int:
    """Closed-loop concurrency that keeps every worker's batches full: max(4, 2 * b * w)."""
    return max(4, 2 * (config.batch_size or 1) * (config.workers or 1))


def _distinct(outcomes: list[Outcome]) -> list[Outcome]:
    """The outcomes to measure; batch size 1 at a second delay is marked same-as the first."""
    first: dict[Batching, Outcome] = {}
    for outcome in outcomes:
        c = outcome.config
        src = first.setdefault(
            replace(c, max_batch_delay_ms=0) if c.batch_size == 1 else c, outcome
        )
        if src is not outcome:
            outcome.status, outcome.same_as = "same-as", src
            outcome.why = "batch size 1 never waits for a batch: the delay does not apply"
    return list(first.values())


@contextmanager
def _searching(
    options: SlaOptions, model: str, run_dir: Path, log: Log, **kw: object
) -> Iterator[_Search]:
    """A search on a fresh server of ``options.archive`` (``kw``: ManagedServer.torchbay's)."""
    with ManagedServer.torchbay(options.archive, run_dir, **kw) as endpoints:
        if endpoints.management_port is None:
            raise BenchError("the server has no management API")
        with LoadGenerator(options.processes) as gen:
            yield _Search(options, endpoints, model, gen, log)


def run_sla(options: SlaOptions, log: Log = print) -> SlaResult:
    """Start one server from ``options.archive``, search every configuration, repeat the top two,
    write the report files into ``options.out_dir`` and optionally apply the winner."""
    manifest = read_manifest(options.archive).model
    if options.apply and not os.access(options.archive.resolve().parent, os.W_OK):
        raise BenchError(f"--apply: {options.archive.parent} is read-only; nothing was run")
    options.out_dir.mkdir(parents=True, exist_ok=True)
    started, name, version = time.monotonic(), manifest.model_name, manifest.model_version
    search, result = None, None
    try:
        with _searching(options, name, options.out_dir / "server", log) as search:
            result = SlaResult(options, name, version, *search.search_all())
        w = result.winner
        if result.note:
            log(result.note)
        if result.swapped and w is not None:
            log(f"{w.label} held the SLA in every repeat, the search's pick did not: it wins")
        if options.autopilot and result.pace is not None:
            _run_autopilot(result, result.pace, search.progress, log)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: what was measured, in a report saying so
        if search is None:
            raise
        result = result or SlaResult(options, name, version, search.outcomes, [])
        result.interrupted, result.elapsed_s = True, time.monotonic() - started
        sla_report.write_all(result)
        log(f"interrupted: a partial report is in {options.out_dir}")
        raise
    result.elapsed_s = time.monotonic() - started
    try:
        if options.apply and w is not None:
            backup = apply_settings(options.archive, w.config)
            result.applied = options.archive
            log(f"applied {w.label} to {options.archive} (the original is kept as {backup})")
    finally:  # the search's report, whatever --apply met
        sla_report.write_all(result)
    return result


def _run_autopilot(result: SlaResult, winner: Outcome, progress: Eta, log: Log) -> None:
    """The autopilot's runs at the pace's rate (``result.autopilot``), its describe-model state
    after them, then its own search (``result.autopilot_search``). A config.properties sets its
    target (the SLA) and ceilings (the largest searched batch and delay, the pace's workers)."""
    options, model, version = result.options, result.model, result.version or "1.0"
    config = Batching(max(options.batch_sizes), max(options.max_delays_ms), winner.config.workers)
    models = models_json({model: config}, version)
    models[model][version] |= {"marName": options.archive.name, "slaP99Ms": options.sla_p99_ms}
    props = write_properties(options.out_dir / "autopilot", models, {})
    at = f"ceilings {config.label()}, slaP99Ms {options.sla_p99_ms:g}"
    log(f"autopilot: {at}, at {winner.best_rate:.1f} req/s")
    runs = result.autopilot = Outcome(config, best_rate=winner.best_rate, name=AUTOPILOT)
    kw = {"extra_args": ("--ts-config", str(props.resolve()))}
    kw["models"] = (f"{model}={options.archive.name}",)  # the model as the config names it
    with _searching(options, model, props.parent / "server", log, **kw) as search:
        search.progress = progress
        search.repeat([runs], AUTOPILOT, max(1, options.repeats))
        result.autopilot_state = search.mgmt.describe(model, None).get("autopilot")
        searched = result.autopilot_search = Outcome(config)
        search.probe(searched)
        progress.tick(f"{AUTOPILOT} probed")
        search.search(searched)
        progress.tick(f"{AUTOPILOT} searched")
        log(f"autopilot: {searched.status}: {searched.why}")
