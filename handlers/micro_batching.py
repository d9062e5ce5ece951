"""TorchServe's ``ts.handler_utils.micro_batching.MicroBatching``: a batch cut into micro-batches
whose ``preprocess``, ``inference`` and ``postprocess`` run in threads of their own, so that one
micro-batch's inference overlaps the next one's preprocessing (TorchServe's
``examples/micro_batching``). A handler makes it its ``handle``::

    class Handler(ImageClassifier):
        def __init__(self):
            super().__init__()
            self.handle = MicroBatching(self)

        def initialize(self, ctx):
            super().initialize(ctx)
            self.handle.micro_batch_size = 4
            self.handle.parallelism = {"preprocess": 2, "inference": 1, "postprocess": 2}

``parallelism`` is the number of threads per stage (1 each unless set; setting it starts or
stops threads at once), ``micro_batch_size`` the items per micro-batch, and
``get_micro_batch_idx()`` tells a stage which micro-batch it runs. The answers come back in
the batch's order.

Two differences from TorchServe's, both where it hangs: a stage that raises fails the batch (the
worker answers its requests as for any handler error; TorchServe's thread died and the batch
waited for ever), and each call collects only its own micro-batches (two calls at once never
mix). ``context.stage_timings`` holds each stage's time summed over the micro-batches.
"""

from __future__ import annotations

import itertools
import queue
import threading
from copy import copy
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

HANDLER_METHODS = ["preprocess", "inference", "postprocess"]
_POLL_S = 0.5  # how often an idle stage thread looks whether it was stopped


@dataclass
class _Job:
    """One micro-batch on its way through the stages: its index, its data (or the exception a
    stage raised, passed on untouched), and where its call collects it."""

    idx: int
    data: Any
    done: queue.SimpleQueue
    failed: bool = False
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class WorkerThread:
    event: threading.Event
    thread: threading.Thread


class MicroBatching:
    """``handle`` for ``parent_handler``: see the module's doc."""

    def __init__(
        self,
        parent_handler: Any,
        micro_batch_size: int = 1,
        parallelism: dict[str, int] | None = None,
    ) -> None:
        self.handler = parent_handler
        self.micro_batch_size = micro_batch_size
        self._parallelism = dict(parallelism or {})
        self.thread_groups: dict[str, list[WorkerThread]] = {m: [] for m in HANDLER_METHODS}
        # A stage reads its own queue and writes the next one's; the last writes to the job.
        self.queues: dict[str, queue.Queue] = {m: queue.Queue() for m in HANDLER_METHODS}
        self.thread_local_data = threading.local()
        self._lock = threading.Lock()
        self._update_threads()

    @property
    def parallelism(self) -> dict[str, int]:
        return copy(self._parallelism)

    @parallelism.setter
    def parallelism(self, parallelism: dict[str, int]) -> None:
        """Threads per stage: the stages named change, the others keep theirs."""
        unknown = sorted(set(parallelism) - set(HANDLER_METHODS))
        if unknown:
            raise ValueError(f"micro-batching stages are {HANDLER_METHODS}, not {unknown}")
        self._parallelism.update(parallelism)
        self._update_threads()

    def _update_threads(self) -> None:
        with self._lock:
            for stage in HANDLER_METHODS:
                wanted = self._parallelism.get(stage, 1)
                if not isinstance(wanted, int) or wanted < 1:
                    raise ValueError(f"parallelism of {stage} must be a whole number >= 1")
                group = self.thread_groups[stage]
                while len(group) < wanted:
                    event = threading.Event()
                    name = f"micro-batching-{stage}-{len(group)}"
                    thread = threading.Thread(
                        target=self._run_stage, args=(stage, event), name=name, daemon=True
                    )
                    thread.start()
                    group.append(WorkerThread(event, thread))
                while len(group) > wanted:
                    self._stop(group.pop())

    @staticmethod
    def _stop(worker: WorkerThread) -> None:
        worker.event.set()
        if worker.thread is not threading.current_thread():
            worker.thread.join()

    def shutdown(self) -> None:
        """Stop every stage thread (all told first, so they end together)."""
        workers = [w for group in self.thread_groups.values() for w in group]
        for group in self.thread_groups.values():
            group.clear()
        for worker in workers:
            worker.event.set()
        for worker in workers:
            self._stop(worker)

    def __del__(self) -> None:
        for group in getattr(self, "thread_groups", {}).values():
            for worker in group:
                worker.event.set()  # the threads end within _POLL_S; nobody waits for them

    def _run_stage(self, stage: str, stopped: threading.Event) -> None:
        inbox = self.queues[stage]
        later = HANDLER_METHODS.index(stage) + 1
        outbox = self.queues[HANDLER_METHODS[later]] if later < len(HANDLER_METHODS) else None
        while not stopped.is_set():
            try:
                job: _Job = inbox.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if not job.failed:
                self._call(stage, job)
            if outbox is None or job.failed:
                job.done.put(job)
            else:
                outbox.put(job)

    def _call(self, stage: str, job: _Job) -> None:
        self.thread_local_data.micro_batch_idx = job.idx
        start = perf_counter()
        try:
            job.data = getattr(self.handler, stage)(job.data)
        except BaseException as exc:  # the call that waits for this job raises it
            job.data, job.failed = exc, True
        job.timings[stage] = (perf_counter() - start) * 1000

    def get_micro_batch_idx(self) -> int | None:
        """The index of the micro-batch the calling stage thread is running."""
        return getattr(self.thread_local_data, "micro_batch_idx", None)

    def handle(self, data: list[Any]) -> list[Any]:
        """``data`` through the stages in micro-batches; the answers in ``data``'s order."""
        size = self.micro_batch_size
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"micro_batch_size must be a whole number >= 1, not {size!r}")
        done: queue.SimpleQueue = queue.SimpleQueue()
        starts = range(0, len(data), size)
        for idx, start in enumerate(starts):
            self.queues[HANDLER_METHODS[0]].put(_Job(idx, data[start : start + size], done))
        jobs = sorted((done.get() for _ in starts), key=lambda job: job.idx)
        self._record_timings(jobs)
        for job in jobs:
            if job.failed:
                raise job.data
        return list(itertools.chain.from_iterable(job.data for job in jobs))

    def _record_timings(self, jobs: list[_Job]) -> None:
        timings = getattr(getattr(self.handler, "context", None), "stage_timings", None)
        if isinstance(timings, dict):
            for stage in HANDLER_METHODS:
                timings[stage] = sum(job.timings.get(stage, 0.0) for job in jobs)

    def __call__(self, data: list[Any], context: Any) -> list[Any]:
        """The handler's ``handle(data, context)``: describe and explain as BaseHandler does,
        everything else in micro-batches (``HandlerTime`` is the worker's, as for any handler)."""
        handler = self.handler
        handler.context = context
        if hasattr(context, "stage_timings"):
            context.stage_timings = {}
        output: list[Any]
        if handler._is_describe():
            output = [handler.describe_handle()]
        elif handler._is_explain():
            output = handler.explain_handle(handler.preprocess(data), data)
        else:
            output = self.handle(data)
        return output
