"""Requests of one batch that ask for different things run as batches of their own.

TorchServe's handlers (``BaseHandler._is_explain`` / ``_is_describe``, ours and theirs) read the
``explain`` and ``describe`` headers of a batch's first request and treat the whole batch so:
gathered into one batch, a prediction would be answered an explanation, or the other way round.
The Service therefore splits a batch by those headers first (``by_mode``), so every handler sees
batches of one kind only, and each request gets what it asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

MODE_HEADERS = ("explain", "describe")


def mode_of(headers: Mapping[str, Any]) -> tuple[bool, ...]:
    """Which of the mode headers the request sets (any non-empty value, as the handlers read)."""
    lower = {str(name).lower(): value for name, value in headers.items()}
    return tuple(bool(lower.get(name)) for name in MODE_HEADERS)


def by_mode(jobs: Sequence[Any], run: Callable[[list[Any]], list[Any]]) -> list[Any]:
    """``run`` over the jobs (each with its ``request.headers``) of each mode, in order of first
    appearance, the answers put back in ``jobs``' order; a batch of one mode is one ``run``."""
    modes = [mode_of(job.request.headers) for job in jobs]
    if len(set(modes)) <= 1:
        return run(list(jobs))
    answers: list[Any] = [None] * len(jobs)
    for mode in dict.fromkeys(modes):
        members = [i for i, m in enumerate(modes) if m == mode]
        for i, answer in zip(members, run([jobs[i] for i in members]), strict=True):
            answers[i] = answer
    return answers
