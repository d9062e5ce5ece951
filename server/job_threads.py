"""The event loop's default executor (``asyncio.to_thread``, ``run_in_executor(None, ...)``): an
archive's extraction, a manifest's read, a worker's spawn or discard.

asyncio's own is a ThreadPoolExecutor: the loop's close (``asyncio.run``, ``uvloop.run``:
``shutdown_default_executor``) waits for its jobs without a bound, and the interpreter joins its
threads at exit. One job still running when the stop is done (an archive being extracted for a
registration the stop cut short, a read stuck on a hung network mount) kept a stopped server from
ever exiting, past any grace period, until Kubernetes' SIGKILL. Every job the server awaits is
done by then; one still running is an orphan whose caller is gone. Here the threads are daemon
threads, and ``shutdown`` does not wait for jobs still running: they are abandoned, and the
process exits within its stop bound.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

_Job = tuple[Future, Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class JobThreads(ThreadPoolExecutor):
    """A ThreadPoolExecutor (asyncio's ``set_default_executor`` takes nothing else) of daemon
    threads, as many as ThreadPoolExecutor's default, started as jobs need them."""

    def __init__(self) -> None:
        super().__init__(thread_name_prefix="torchbay-job")  # only its _max_workers is used
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._idle_threads = threading.Semaphore(0)
        self._started: list[threading.Thread] = []
        self._guard = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        with self._guard:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._jobs.put((future, fn, args, kwargs))
            idle = self._idle_threads.acquire(blocking=False)
            if not idle and len(self._started) < self._max_workers:
                name = f"torchbay-job-{len(self._started)}"
                thread = threading.Thread(target=self._work, name=name, daemon=True)
                thread.start()
                self._started.append(thread)
        return future

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn, args, kwargs = job
            del job
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # the caller's to see, as ThreadPoolExecutor's
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            del future, fn, args, kwargs
            self._idle_threads.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new jobs; idle threads end; queued jobs are still run, running ones are not
        waited for (see the module)."""
        with self._guard:
            if self._closed:
                return
            self._closed = True
            count = len(self._started)
        for _ in range(count):
            self._jobs.put(None)
