"""When a worker is past a recycling limit (``max_requests_per_worker``, ``max_worker_rss_mb``):
the slot asks after each batch and, on yes, starts a replacement beside it (slot.py). Torch-free.
"""

from __future__ import annotations

import logging

import psutil

from torchbay.server.serving.handle import WorkerProcess
from torchbay.server.serving.launch import ModelSettings

log = logging.getLogger("torchbay.model")

# A worker's RSS is read at most this often (recycling on memory).
RSS_CHECK_INTERVAL_S = 1.0
_MIB = 1 << 20


def past_limit(worker: WorkerProcess, settings: ModelSettings, key: str, now: float) -> bool:
    """Whether ``worker`` served its request limit or grew past its memory limit (read at most
    every RSS_CHECK_INTERVAL_S of the loop's clock ``now``); the reason is logged."""
    limit = settings.max_requests_per_worker
    if limit and worker.requests >= limit:
        log.info(
            "model %s: worker %s served %d requests (limit %d); recycling it",
            *(key, worker.name, worker.requests, limit),
        )
        return True
    limit_mb = settings.max_worker_rss_mb
    if not limit_mb or now - worker.rss_checked_at < RSS_CHECK_INTERVAL_S:
        return False
    worker.rss_checked_at = now
    try:
        rss = psutil.Process(worker.pid).memory_info().rss if worker.pid else 0
    except (psutil.Error, OSError):
        return False  # it is exiting; the supervisor sees that
    if rss > limit_mb * _MIB:
        log.info(
            "model %s: worker %s uses %d MiB (limit %d MiB); recycling it",
            *(key, worker.name, rss // _MIB, limit_mb),
        )
        return True
    return False
