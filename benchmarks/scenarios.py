"""What every benchmark describes a served model and a judged figure with: a model's
:class:`Batching` (its ``models={...}`` entry, :func:`models_json`, or its live settings) and a
:class:`Goal` that judges a row of round two's table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchbay.benchmarks.report import Ratio, RowResult, ratios


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
