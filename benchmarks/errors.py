"""The benchmarks' one error: a server under test cannot start, a load generator is missing or
fails, or a result cannot be read. ``torchbay.cli`` prints its message and exits 1, and so does
``python -m torchbay.benchmarks.tables``."""


class BenchError(Exception):
    """A benchmark could not run or its results could not be read."""
