"""observe/retired.py: the series of versions gone, kept within a bound, on a real registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from torchbay.server.observe.retired import Retired


def _models(registry: CollectorRegistry) -> set[tuple[str, str]]:
    return {
        (s.labels["model"], s.labels["version"])
        for family in registry.collect()
        for s in family.samples
        if "model" in s.labels
    }


def test_the_oldest_versions_gone_lose_every_series_and_a_registered_one_none() -> None:
    registry = CollectorRegistry()
    codes = Counter("codes", "", ("model", "version", "code"), registry=registry)
    stages = Histogram("stages", "", ("model", "version", "stage"), registry=registry)
    live = {("kept", "1")}
    dropped: list[tuple[str, str]] = []
    families = [
        (codes, ("model", "version", "code"), None),  # looked up
        (stages, ("model", "version", "stage"), [("inference",), ("handler",)]),  # known
    ]
    retired = Retired(families, lambda: live, dropped.append, keep=2)

    def serve(key: tuple[str, str]) -> None:  # registered, asked, unregistered
        live.add(key)
        retired.used(key)
        for code in ("200", "503"):
            codes.labels(*key, code).inc()
        stages.labels(*key, "inference").observe(0.1)
        if key[0] != "kept":
            live.discard(key)

    for name in ("kept", "a", "b", "c", "d"):
        serve((name, "1"))
    # Gone: a, b, c when d was used: a lost every series, of both families.
    assert _models(registry) == {("kept", "1"), ("b", "1"), ("c", "1"), ("d", "1")}
    assert dropped == [("a", "1")]
    serve(("b", "1"))  # back: now the most recently used
    serve(("e", "1"))
    assert _models(registry) == {("kept", "1"), ("b", "1"), ("d", "1"), ("e", "1")}
    live.clear()  # "kept" unregistered: its series go in turn, oldest first
    serve(("f", "1"))
    assert dropped == [("a", "1"), ("c", "1"), ("kept", "1"), ("d", "1")]
