"""The SLA search's options (one field per ``torchbay bench sla`` flag) and results, apart from
the search so that ``sla_report.py`` and ``plots.py`` read results without it."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from torchbay.benchmarks.bench import LoadOptions, flag
from torchbay.benchmarks.loadgen import LoadResult
from torchbay.benchmarks.scenarios import Batching
from torchbay.benchmarks.stats import Arrival


class SlaOptions(LoadOptions):
    """Settings of one SLA search."""

    archive: Path = flag(...)
    sla_p99_ms: float = flag(..., gt=0)
    batch_sizes: tuple[int, ...] = flag((1,), metavar="1,2,4")
    max_delays_ms: tuple[float, ...] = flag((5.0,), metavar="2,5,10")
    workers: tuple[int, ...] = flag((1,), metavar="1,2")
    max_error_rate: float = flag(0.001, ge=0, le=1)
    step_s: float = flag(3.0, "--step", metavar="S", help="per step", gt=0)
    step_warmup_s: float = flag(0.5, "--step-warmup", metavar="S", ge=0)
    probe_s: float = flag(2.0, "--probe", metavar="S", gt=0)
    ramp_factor: float = Field(1.5, gt=1)
    precision: float = Field(0.05, gt=0)
    max_steps: int = Field(12, ge=2)
    bound_margin: float = Field(0.1, ge=0)
    repeats: int = flag(3, ge=0)
    config_warmup_s: float = flag(
        2.0,
        "--config-warmup",
        metavar="S",
        help="closed-loop warm-up after each reconfiguration",
        ge=0,
    )
    min_requests: int = flag(
        200, help="lengthen low-rate steps to at least this many requests (max 5 steps)", ge=1
    )
    arrival: Arrival = flag("poisson")
    prune: bool = flag(True, "--no-prune", help="search every configuration")
    timeout_s: float = Field(5.0, gt=0)
    out_dir: Path = flag(Path("bench-sla"), "--out", help="report folder")
    apply: bool = flag(
        False, help="write the winner into the archive's model-config.yaml (original kept as .orig)"
    )
    autopilot: bool = flag(
        True,
        "--no-autopilot",
        help="skip measuring the SLA autopilot (slaP99Ms) at the winner's rate",
    )

    @field_validator("batch_sizes", "workers", "max_delays_ms")
    @classmethod
    def _grid(cls, values: tuple, info: ValidationInfo) -> tuple:
        what, low = ("delays", 0) if info.field_name == "max_delays_ms" else ("values", 1)
        if not values or any(v < low for v in values):
            raise ValueError(f"give one or more {what} >= {low}")
        return tuple(dict.fromkeys(values))

    def configurations(self) -> list[Batching]:
        """Every grid point, workers outermost (scaling workers is the slow change)."""
        grid = itertools.product(self.workers, self.batch_sizes, self.max_delays_ms)
        return [Batching(b, d, w) for w, b, d in grid]


@dataclass(frozen=True)
class Step:
    """One open-loop (or probe) measurement of one configuration."""

    config: Batching
    phase: str  # probe | ramp | bisect | repeat
    offered_rate: float
    result: LoadResult
    passed: bool
    reason: str
    mean_batch_size: float = math.nan
    queue_mean_ms: float = math.nan


@dataclass
class Outcome:
    """A configuration's search result. ``status``: searched | infeasible | skipped | same-as.
    Its repeats are its steps of phase ``repeat`` (the autopilot's: ``autopilot``), all at one
    rate; ``name`` labels the autopilot's row."""

    config: Batching
    status: str = "pending"
    why: str = ""
    capacity: float = math.nan
    best_rate: float = 0.0
    best_step: Step | None = None
    steps: list[Step] = field(default_factory=list)
    same_as: Outcome | None = None  # the measured outcome it shares (batch size 1)
    name: str | None = None

    @property
    def label(self) -> str:
        return self.name or self.config.label()

    @property
    def runs(self) -> list[Step]:
        return [s for s in self.steps if s.phase in ("repeat", "autopilot")]

    @property
    def rate(self) -> float:
        """The repeats' rate (the search's best rate before any ran)."""
        return self.runs[0].offered_rate if self.runs else self.best_rate

    @property
    def p99_ms(self) -> list[float]:
        return [s.result.latency.p99_ms for s in self.runs]

    @property
    def ok_per_s(self) -> list[float]:
        return [s.result.ok_per_s for s in self.runs]

    @property
    def passed(self) -> list[bool]:
        return [s.passed for s in self.runs]


@dataclass
class SlaResult:
    """A search's outcomes; the winner, runner-up and note crowned from ``ranked``'s repeats."""

    options: SlaOptions
    model: str
    version: str | None
    outcomes: list[Outcome]
    ranked: list[Outcome]  # the (at most two) best that met the SLA, best first, repeated
    elapsed_s: float = 0.0
    applied: Path | None = None
    autopilot: Outcome | None = None  # its runs at the pace's rate (sla._run_autopilot)
    autopilot_state: dict[str, Any] | None = None  # its describe-model state after those runs
    autopilot_search: Outcome | None = None  # its own highest rate within the SLA, searched
    interrupted: bool = False  # stopped (Ctrl-C, SIGTERM) before the end: a partial report

    def __post_init__(self) -> None:
        """Crown the winner. One that missed the SLA in ANY repeat never is: of those repeated,
        the best-ranked one that held it in every repeat wins; if none did, there is no winner
        (the note says so). With no repeats run, the search's pick stands (its best step passed).
        """
        self.repeats = [oc for oc in self.ranked if oc.runs]  # the search's order
        held = [oc for oc in self.repeats if all(oc.passed)] if self.repeats else self.ranked
        missed = ", ".join(oc.label for oc in self.repeats if not all(oc.passed))
        self.note = missed and f"{missed} missed the SLA in at least one repeat and cannot win."
        if self.repeats and not held:
            self.note += " No repeated configuration held the SLA in every repeat."
        self.winner = held[0] if held else None
        others = [oc for oc in self.repeats or self.ranked if oc is not self.winner]
        self.runner_up = others[0] if others and self.winner else None
        # The search's pick missed the SLA in a repeat and one ranked below it won.
        self.swapped = self.winner is not None and self.winner is not self.ranked[0]
        # The best static configuration's rate, crowned or not: the autopilot is run at it.
        self.pace = self.winner or (self.ranked[0] if self.ranked else None)
