"""One batch on one worker: run it, answer each request's future exactly once, and say what
happened (:class:`BatchRecord`, for the metrics and the Triton statistics). Torch-free."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from torchbay.server.errors import HandlerFailed, TorchbayError
from torchbay.server.serving import protocol as p
from torchbay.server.serving.handle import WorkerProcess
from torchbay.server.serving.launch import ModelSettings
from torchbay.server.serving.queue import Pending, clock, reject, resolve
from torchbay.server.serving.streams import BatchStreams

log = logging.getLogger("torchbay.model")

Batch = list[Pending[p.WireRequest, p.WireResponse]]


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """What an observer learns from one batch."""

    size: int
    queue_times_s: list[float]
    timings_ms: dict[str, float]
    metrics: list[dict[str, Any]]
    run_s: float = 0.0  # the batch's wall time on its worker (admission's service rate)
    request_ids: tuple[str, ...] = ()  # TorchServe's model metrics log lines name them
    # Some request answered below 400: TorchServe's HandlerTime and PredictionTime are measured
    # only when the handler returned (an error on every request is taken as a raise).
    answered: bool = True
    levels: tuple[int, ...] = ()  # each request's priority level, 0-based (a queue with levels)
    # False: a management describe's batch. TorchServe times its handler (HandlerTime,
    # PredictionTime, WorkerThreadTime) but counts no inference: no batch metric, statistic,
    # service rate or autopilot sample.
    inference: bool = True
    # The requests answered below 400 (None: all of them): Triton's per-request compute
    # statistics count successful requests alone (its UpdateSuccess; a failure has none).
    succeeded: int | None = None
    # The requests the handler ran (None: all): Triton's batch_stats size is the batch the
    # model executed, without those refused before it (for their input or region).
    executed: int | None = None


async def run_batch(
    worker: WorkerProcess, batch: Batch, settings: ModelSettings, key: str
) -> BatchRecord | None:
    """Run one batch on ``worker`` and answer each request's future exactly once (its streamed
    parts go to its ``Parts``, see streams.py); the batch's record, or None when the whole batch
    failed (worker died, timeout, wrong result count)."""
    streams = BatchStreams(worker, batch, settings.max_response_size, key)
    started = clock()
    try:
        result = await worker.infer(
            [item.payload for item in batch], settings.response_timeout_s or None, streams.on_part
        )
    except TorchbayError as exc:  # WorkerDied, RequestTimeout
        for item in batch:
            reject(item.future, type(exc)(exc.message))
        return None
    finally:
        streams.close()
    if len(result.responses) != len(batch):
        for item in batch:
            reject(item.future, HandlerFailed("The worker answered the wrong number of results"))
        return None
    limit = settings.max_response_size
    for item, response in zip(batch, result.responses, strict=True):
        if limit and len(response.body) > limit:
            reject(item.future, _too_large(key, item, len(response.body), limit))
            continue
        resolve(item.future, response)
    return batch_record(batch, result, started)


def batch_record(batch: Batch, result: Any, started: float) -> BatchRecord:
    """The record of ``batch``, answered by the worker with ``result`` (its ``InferResult``),
    which ``started`` (``clock()``) to run; ``inference`` False for a management describe's
    (TorchServe counts it in no inference metric, nor is it Triton's execution)."""
    return BatchRecord(
        size=len(batch),
        queue_times_s=[(item.dispatched or item.arrival) - item.arrival for item in batch],
        timings_ms=result.timings,
        metrics=result.metrics,
        run_s=clock() - started,
        request_ids=tuple(str(item.payload.request_id) for item in batch),
        answered=any(response.status < 400 for response in result.responses),
        levels=tuple(item.place >> 1 for item in batch),  # place: 2 * level (+1 delayed)
        inference=any(item.counted for item in batch),
        succeeded=sum(response.status < 400 for response in result.responses),
        executed=getattr(result, "handled", None),
    )


def lost_metrics(worker: WorkerProcess, batch: Batch) -> tuple[list[dict[str, Any]], str]:
    """The handler's metric records of ``batch`` when its worker died in it (or was killed on
    the response timeout), read from the worker's spill (serving.spill), and the batch's request
    ids: TorchServe publishes what a handler recorded before its worker died."""
    if worker.alive or worker.spill is None:
        return [], ""
    return worker.spill.take(), ",".join(str(item.payload.request_id) for item in batch)


def _too_large(key: str, item: Pending, size: int, limit: int) -> HandlerFailed:
    """The 500 for a response past ``max_response_size`` (logged: a handler's bug)."""
    rid = item.payload.request_id
    log.error(
        "model %s: request %s: the handler's response of %d bytes exceeds max_response_size "
        "(%d bytes); answered 500",
        *(key, rid, size, limit),
    )
    return HandlerFailed(
        f"The model's response of {size} bytes exceeds the server's max_response_size of "
        f"{limit} bytes"
    )
