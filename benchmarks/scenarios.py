"""Every benchmark scenario in one description: a :class:`Scenario` is one server serving one
model under one load with one :class:`Batching`; a :class:`Goal` judges a table's row; a
:class:`Suite` is what ``torchbay bench scenario NAME`` runs."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.loadplan import LoadPlan
from torchbay.benchmarks.report import Ratio, RowResult, ratios

if TYPE_CHECKING:
    from pathlib import Path

    from torchbay.benchmarks.bench import RunOptions
    from torchbay.benchmarks.loadplan import Target
    from torchbay.benchmarks.stats import Arrival

ServerKind = Literal["echo", "naive", "torchbay", "torchserve"]


@dataclass(frozen=True)
class Batching:
    """One model's batching and scale: its ``models={...}`` entry when a server starts, or what
    the management API changes on a running one (None leaves a setting as it is)."""

    batch_size: int | None = 1
    max_batch_delay_ms: float | None = 0
    workers: int | None = 1

    def keys(self) -> dict[str, int | float]:
        """The settings given, by their ``models={...}`` names (a whole delay as an int)."""
        delay = self.max_batch_delay_ms
        delay = int(delay) if delay is not None and float(delay).is_integer() else delay
        keys = {"batchSize": self.batch_size, "maxBatchDelay": delay}
        keys |= {"minWorkers": self.workers, "maxWorkers": self.workers}
        return {k: v for k, v in keys.items() if v is not None}

    def label(self) -> str:
        """``b8-d5-w1``: the SLA search's name for a configuration."""
        return f"b{self.batch_size}-d{self.max_batch_delay_ms:g}-w{self.workers}"

    def describe(self) -> str:
        """``batch 8, delay 5 ms, 1 w``: round two's settings line."""
        return f"batch {self.batch_size}, delay {self.max_batch_delay_ms} ms, {self.workers} w"


def models_json(models: dict[str, Batching], version: str = "1.0") -> dict[str, Any]:
    """TorchServe's ``models={...}`` for ``{name: batching}`` (torchbay reads the same)."""
    return {
        name: {version: {"defaultVersion": True, "marName": f"{name}.mar", **b.keys()}}
        for name, b in models.items()
    }


@dataclass(frozen=True)
class Scenario:
    """One server under one load: a closed loop at ``concurrency`` connections, or (``rate`` set,
    ``concurrency`` None) an open loop at ``rate`` requests/s; the ceilings ignore the batching."""

    name: str
    server: ServerKind
    model: str
    concurrency: int | None
    batch_size: int = 1
    max_batch_delay_ms: int = 0
    workers: int = 1
    tags: tuple[str, ...] = ()
    server_args: tuple[str, ...] = ()  # extra `torchbay serve` flags
    rate: float | None = None
    arrival: Arrival = "constant"

    def __post_init__(self) -> None:
        closed = self.concurrency is not None and self.concurrency >= 1
        if closed == (self.rate is not None and self.rate > 0):
            raise ValueError(
                f"scenario {self.name}: give exactly one of concurrency >= 1 (closed loop) "
                "or rate > 0 (open loop)"
            )

    @property
    def batching(self) -> Batching:
        return Batching(self.batch_size, self.max_batch_delay_ms, self.workers)

    @property
    def setup(self) -> str:
        """The load (``c=16`` or ``r=2000 poisson``) and, for torchbay, the batching."""
        load = f"c={self.concurrency}" if self.rate is None else f"r={self.rate:g} {self.arrival}"
        batching = f" b={self.batch_size} d={self.max_batch_delay_ms} w={self.workers}"
        return load + (batching if self.server == "torchbay" else "")

    def plan(self, target: Target, duration_s: float) -> LoadPlan:
        """This load on ``target`` for ``duration_s``."""
        load = {"arrival": self.arrival, "duration_s": duration_s}
        return LoadPlan.of(target, self.concurrency, self.rate, **load)

    def matches(self, pattern: str) -> bool:
        """True if ``pattern`` is this scenario's name (glob allowed), its server or a tag."""
        return pattern in (self.server, *self.tags) or fnmatch.fnmatchcase(self.name, pattern)


@dataclass(frozen=True)
class Goal:
    """A figure of a row: ``numerator.metric / denominator.metric`` within each round (drift
    cancels) or ``numerator.metric`` alone, judged as ``aggregate`` ``op`` ``bound`` (">=" for a
    ratio, "<=" alone, unless ``op`` says); no bound: shown, not judged."""

    key: str
    about: str
    numerator: str
    metric: str
    bound: float | None = None
    denominator: str | None = None
    aggregate: str = "median"
    op: str = ""

    def ratio(self, row: RowResult) -> Ratio:
        """This goal over ``row``: the figure of every round."""
        values = row.series(self.numerator, self.metric)
        if self.denominator is not None:
            values = ratios(values, row.series(self.denominator, self.metric))
        op = self.op or (">=" if self.denominator is not None else "<=")
        name = f"{self.key}: {self.about}" if self.about else self.key
        return Ratio(name, values, self.bound, op, self.aggregate)


TB_TINY = Scenario("tb-tiny-c16-b8-w1", "torchbay", "tiny", 16, 8, 5, 1, tags=("a", "d"))
SCENARIOS: tuple[Scenario, ...] = (
    Scenario("echo-c16", "echo", "tiny", 16, tags=("ceiling",)),
    Scenario("naive-tiny-c16", "naive", "tiny", 16, tags=("ceiling",)),
    Scenario("naive-cnn-c10", "naive", "cnn", 10, tags=("ceiling",)),
    TB_TINY,
    replace(TB_TINY, name=f"{TB_TINY.name}-nolog", tags=("a",), server_args=("--no-access-log",)),
    Scenario("tb-cnn-c1-b1-w1", "torchbay", "cnn", 1, 1, 10, 1, tags=("b",)),
    Scenario("tb-cnn-c1-b8-w1", "torchbay", "cnn", 1, 8, 10, 1, tags=("b",)),
    Scenario("tb-cnn-c10-b1-w2", "torchbay", "cnn", 10, 1, 10, 2, tags=("c",)),
)

_TINY, _CNN_W2, _RPS = TB_TINY.name, "tb-cnn-c10-b1-w2", "req_per_s"
TARGETS: tuple[Goal, ...] = (
    Goal("a", "tiny c16 b8 w1 vs bare ASGI echo", _TINY, _RPS, 0.30, "echo-c16"),
    Goal("a-nolog", "same, --no-access-log", f"{_TINY}-nolog", _RPS, 0.30, "echo-c16"),
    Goal("b", "cnn c1: batch 8 vs batch 1", "tb-cnn-c1-b8-w1", _RPS, 0.95, "tb-cnn-c1-b1-w1"),
    Goal("c", "cnn c10 b1 w2 vs naive FastAPI", _CNN_W2, _RPS, 1.0, "naive-cnn-c10"),
    Goal("c-p99", "cnn c10 b1 w2 p99 (ms)", _CNN_W2, "p99_ms", 60.0),
    Goal("d-rss", "frontend RSS (MB), tiny", _TINY, "frontend_rss_mb", 100.0),
    Goal("d-start", "start to first answer (s), tiny", _TINY, "start_s", 1.5),
)


@dataclass(frozen=True)
class Suite:
    """What ``torchbay bench scenario NAME`` runs: torchbay scenarios on one archive (the runs'
    reference model unless ``archive``, which ``script`` builds; paths from the repository root)
    and, with ``--sla``, an SLA search (``sla``: ``SlaOptions`` fields)."""

    name: str
    about: str
    runs: tuple[Scenario, ...]
    sla: dict[str, Any] = field(default_factory=dict, compare=False)
    duration_s: float = 20.0
    warmup_s: float = 5.0
    archive: str | None = None
    script: str | None = None
    inputs: tuple[str, ...] = ()
    content_type: str | None = None

    def __post_init__(self) -> None:
        models = {run.model for run in self.runs}
        if len(models) != 1:
            raise ValueError(f"suite {self.name}: its runs must share one model, not {models}")
        for run in self.runs:
            if run.server != "torchbay" or run.server_args:
                raise ValueError(f"suite {self.name}: {run.name} is not a plain torchbay run")

    @property
    def model(self) -> str:
        return self.runs[0].model

    def run_options(
        self, run: Scenario, archive: Path, inputs: list[Path], run_dir: Path
    ) -> RunOptions:
        """``bench run``'s options for ``run``, one of the suite's scenarios."""
        from torchbay.benchmarks.bench import RunOptions

        where = {"archive": archive, "inputs": tuple(inputs), "run_dir": run_dir}
        load = {"concurrency": run.concurrency, "rate": run.rate, "arrival": run.arrival}
        timing = {"duration_s": self.duration_s, "warmup_s": self.warmup_s}
        options = {**where, **load, **asdict(run.batching), "content_type": self.content_type}
        return RunOptions(**timing, **options)


def select(
    patterns: Iterable[str] | None, scenarios: Iterable[Scenario] = SCENARIOS
) -> list[Scenario]:
    """Scenarios matching any pattern (name glob, server kind or tag); all when none given. A
    pattern that matches nothing is a BenchError, so a typo never runs an empty benchmark."""
    scenarios = list(scenarios)
    patterns = [p for p in (patterns or []) if p]
    for pattern in patterns:
        if not any(s.matches(pattern) for s in scenarios):
            names = ", ".join(s.name for s in scenarios)
            raise BenchError(f"no scenario matches {pattern!r}; known: {names}")
    return [s for s in scenarios if not patterns or any(s.matches(p) for p in patterns)]


def _own_rows(model: str, conc: int, batch: int, workers: int, rate: float) -> tuple[Scenario, ...]:
    """A suite's own rows, 5 ms delay: ``conc`` connections on ``workers`` workers, and Poisson
    arrivals at ``rate`` on one."""
    closed, tags = f"tb-{model}-c{conc}-b{batch}-w{workers}", (model,)
    opened = f"tb-{model}-r{rate:g}-b{batch}-w1"
    return (
        Scenario(closed, "torchbay", model, conc, batch, 5, workers, tags),
        Scenario(opened, "torchbay", model, None, batch, 5, 1, tags, rate=rate, arrival="poisson"),
    )


SUITES: tuple[Suite, ...] = (
    Suite(
        "tiny",
        "the baseline's tiny model (Linear-ReLU-Linear, 256-byte bodies): measures the server",
        runs=(*select(["tb-tiny-c16-b8-w1"]), *_own_rows("tiny", 16, 8, 2, rate=2000.0)),
        sla=dict(sla_p99_ms=10, batch_sizes=[1, 8, 16], max_delays_ms=[1, 5], workers=[1, 2]),
    ),
    Suite(
        "cnn",
        "the baseline's cnn (a small ResNet, ~6.4 ms per 3x64x64 image): compute-bound",
        runs=tuple(select(["tb-cnn-c1-b1-w1", "tb-cnn-c1-b8-w1", "tb-cnn-c10-b1-w2"])),
        sla=dict(sla_p99_ms=100, batch_sizes=[1, 4, 8], max_delays_ms=[2, 10], workers=[1, 2]),
    ),
    Suite(
        "digits",
        "the digits example: an 8x8 grayscale CNN behind the image_classifier handler, PNG bodies",
        runs=_own_rows("digits", 8, 4, 1, rate=200.0),
        sla=dict(
            sla_p99_ms=100, batch_sizes=[1, 2, 4, 8, 16], max_delays_ms=[2, 5, 10], workers=[1, 2]
        ),
        duration_s=10.0,
        warmup_s=3.0,
        archive="examples/digits/out/model_store/digits.mar",
        script="examples/digits/build.py",
        inputs=tuple(f"examples/digits/out/sample_{digit}.png" for digit in (0, 3, 7)),
    ),
)


def suite_names() -> list[str]:
    return [suite.name for suite in SUITES]


def find_suite(name: str) -> Suite:
    """The suite called ``name``; raises BenchError naming the known ones."""
    for suite in (suite for suite in SUITES if suite.name == name):
        return suite
    raise BenchError(f"no scenario suite {name!r}; known: {', '.join(suite_names())}")
