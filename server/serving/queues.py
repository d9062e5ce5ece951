"""Which queue a model version gets: a plain or prioritized ``BatchQueue`` (serving/queue.py,
serving/priority.py), a ``SequenceQueue`` for a sequence model (serving/sequences.py), or a
``ContinuousSequenceQueue`` for a sequence model with continuous batching
(serving/continuous.py). Torch-free."""

from __future__ import annotations

from typing import Any

from torchbay.server.serving.continuous import ContinuousSequenceQueue
from torchbay.server.serving.queue import BatchQueue
from torchbay.server.serving.sequences import SequenceQueue

__all__ = ["new_queue"]


def new_queue(settings: Any, levels: Any = None) -> BatchQueue:
    """A model version's queue: a ``SequenceQueue`` for a sequence model (``sequenceBatching``),
    else a ``BatchQueue`` with the model's priority ``levels`` (serving/priority.py; None: the
    plain queue). ``maxNumSequence`` is raised to what the workers' batches hold at once (batch
    size x max workers), as TorchServe raises it. A sequence model has no priority levels: its
    order is each sequence's own. With ``continuousBatching``, a ``ContinuousSequenceQueue``."""
    common = {
        "batch_size": settings.batch_size,
        "max_delay_s": settings.max_batch_delay_ms / 1000,
        "capacity": settings.job_queue_size,
    }
    if not settings.sequence_mode:
        return BatchQueue(**common, levels=levels)
    workers = max(settings.max_workers or 0, settings.min_workers, 1)
    kind = ContinuousSequenceQueue if settings.continuous_batching else SequenceQueue
    return kind(
        **common,
        max_sequences=max(settings.max_num_sequence, settings.batch_size * workers),
        per_sequence=settings.max_sequence_job_queue_size,
        idle_s=settings.sequence_max_idle_ms / 1000,
        timeout_s=settings.sequence_timeout_ms / 1000,
        strategy=settings.sequence_strategy,
    )
