"""The per-version series of model versions no longer registered, kept within a bound.

A version's ``torchbay_*`` series (labels ``model``, ``version``) stay after it is unregistered,
so that its counters count on when the same name and version come back, as TorchServe's do. But
a server that registers ever new names (SageMaker's multi-model endpoint, a Triton repository
of many models loaded in turn) would add about 160 lines to ``/metrics``, and their children to
memory, per name for good. :class:`Retired` keeps the series of the ``keep`` most recently used
versions that are gone, and drops the older ones' from every family; a registered version's
series are never dropped. Torch-free.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterable
from typing import Any

# Unregistered versions whose series stay (the most recently used first out last).
KEEP = 100

Key = tuple[str, str]  # (model, version)
# A labelled metric, its label names (``model`` and ``version`` first), and the values its other
# labels can take (None: whatever its children hold, looked up; a scrape's work, so rare).
Family = tuple[Any, tuple[str, ...], "Iterable[tuple[str, ...]] | None"]


class Retired:
    """Which versions have series, in the order they were last used; ``families`` are the
    labelled metrics with ``model`` and ``version`` labels, ``live`` the versions registered,
    ``dropped`` is told of each version whose series went (for caches of children)."""

    def __init__(
        self,
        families: Iterable[Family],
        live: Callable[[], Iterable[Key]],
        dropped: Callable[[Key], None] = lambda key: None,
        keep: int = KEEP,
    ) -> None:
        self.families = list(families)
        self.live = live
        self.dropped = dropped
        self.keep = keep
        self._used: collections.OrderedDict[Key, None] = collections.OrderedDict()

    def used(self, key: Key) -> None:
        """``key`` has (or gets) series: once per version object, never on the hot path."""
        if key in self._used:
            self._used.move_to_end(key)
            return
        self._used[key] = None
        if len(self._used) > self.keep:
            self._forget_gone()

    def _forget_gone(self) -> None:
        live = set(self.live())
        gone = [key for key in self._used if key not in live]
        for key in gone[: max(0, len(gone) - self.keep)]:
            del self._used[key]
            for family, names, rest in self.families:
                drop(family, names, key, rest)
            self.dropped(key)


def drop(
    family: Any, names: tuple[str, ...], key: Key, rest: Iterable[tuple[str, ...]] | None = ((),)
) -> None:
    """Remove every child of ``family`` (label names ``names``) whose model and version are
    ``key``, whatever its other labels (a status code, a stage: ``rest``, or looked up)."""
    if rest is not None:
        found = {(*key, *values) for values in rest}
    else:
        found = set()
        for metric in family.collect():
            for sample in metric.samples:
                labels = sample.labels
                if (labels.get("model"), labels.get("version")) == key:
                    found.add(tuple(labels[name] for name in names))
    for values in found:
        with contextlib.suppress(KeyError):  # removed meanwhile
            family.remove(*values)
