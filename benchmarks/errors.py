"""The benchmarks' one error: a server under test cannot start, a load generator is missing or
fails, or a result cannot be read. ``torchbay.cli`` prints its message and exits 1, and so does a
benchmark module run on its own (``exit_status``)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence


class BenchError(Exception):
    """A benchmark could not run or its results could not be read."""


def exit_status(
    prog: str, run: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None
) -> int:
    """``run(argv)``; a ``BenchError`` it raises is printed to stderr as ``PROG: error: MESSAGE``
    and gives 1."""
    try:
        return run(argv)
    except BenchError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
