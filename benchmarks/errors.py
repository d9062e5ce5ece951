"""Errors of the benchmark part.

``BenchError`` is the one base class; ``torchbay.cli`` prints its message and exits 1. Raised when a
server under test cannot start, a load generator is missing or fails, or its output cannot be read.
"""

from __future__ import annotations


class BenchError(Exception):
    """A benchmark could not run or its results could not be read."""
