"""The shape every per-model-version collector of the metrics port shares: its families are made
afresh at each scrape and filled from every model version the registry lists (autopilot,
cancellations, priority levels, sequences). Torch-free."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from torchbay.server.serving.model import ModelVersion


class VersionCollector(Collector):
    """Read when scraped: ``families()`` names the (empty) families, ``fill`` adds one model
    version's samples to them; ``versions`` lists the model versions."""

    def __init__(self, versions: Callable[[], Iterable[ModelVersion]]) -> None:
        self.versions = versions

    def families(self) -> tuple[Metric, ...]:
        raise NotImplementedError

    def fill(self, mv: ModelVersion, *families: Any) -> None:
        raise NotImplementedError

    def describe(self) -> Iterator[Metric]:
        yield from self.families()

    def collect(self) -> Iterator[Metric]:
        families = self.families()
        for mv in list(self.versions()):
            self.fill(mv, *families)
        yield from families
