"""TorchServe's MicroBatching (``ts.handler_utils.micro_batching``) in process: micro-batches in
the batch's order, threads per stage started and stopped as ``parallelism`` says, a stage that
raises fails its call (TorchServe's waited for ever) and leaves the threads serving, two calls at
once collect their own micro-batches, and the describe path and stage timings as BaseHandler's."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from torchbay.handlers.context import Context, RequestProcessor
from torchbay.handlers.micro_batching import HANDLER_METHODS, MicroBatching


class Stages:
    """Records which micro-batch each stage saw, from which thread; ``fail`` raises in inference
    for the items it names."""

    def __init__(self, fail: set[int] | None = None, pause_s: float = 0.0) -> None:
        self.fail, self.pause_s = fail or set(), pause_s
        self.seen: list[tuple[str, int | None, str, list[Any]]] = []
        self.handle = MicroBatching(self)

    def _note(self, stage: str, data: list[Any]) -> None:
        idx = self.handle.get_micro_batch_idx()
        self.seen.append((stage, idx, threading.current_thread().name, list(data)))

    def preprocess(self, data: list[int]) -> list[int]:
        self._note("preprocess", data)
        time.sleep(self.pause_s)
        return [x * 10 for x in data]

    def inference(self, data: list[int]) -> list[int]:
        self._note("inference", data)
        if self.fail & set(data):
            raise RuntimeError(f"cannot infer {sorted(self.fail & set(data))}")
        return [x + 1 for x in data]

    def postprocess(self, data: list[int]) -> list[int]:
        self._note("postprocess", data)
        return data

    def _is_describe(self) -> bool:
        return bool(self.context.get_request_header(0, "describe"))

    def _is_explain(self) -> bool:
        return False

    def describe_handle(self) -> str:
        return '{"described": true}'


def _context(requests: int = 1, **headers: str) -> Context:
    context = Context("m", "/tmp", {}, 1, None, "1.0")
    context.request_ids = {i: f"r{i}" for i in range(requests)}
    context.request_processor = [RequestProcessor(headers) for _ in range(requests)]
    return context


@pytest.fixture
def stages() -> Any:
    made: list[Stages] = []

    def make(**kw: Any) -> Stages:
        made.append(Stages(**kw))
        return made[-1]

    yield make
    for handler in made:
        handler.handle.shutdown()


def test_micro_batches_run_in_order_of_the_batch(stages) -> None:
    handler = stages()
    handler.handle.micro_batch_size = 3
    out = handler.handle(list(range(8)), _context(8))
    assert out == [x * 10 + 1 for x in range(8)]
    inferred = sorted((idx, data) for stage, idx, _, data in handler.seen if stage == "inference")
    assert inferred == [(0, [0, 10, 20]), (1, [30, 40, 50]), (2, [60, 70])]
    assert handler.context.stage_timings.keys() == set(HANDLER_METHODS)


def test_parallelism_starts_and_stops_threads_per_stage(stages) -> None:
    handler = stages(pause_s=0.05)
    mb = handler.handle
    assert {s: len(g) for s, g in mb.thread_groups.items()} == dict.fromkeys(HANDLER_METHODS, 1)
    mb.parallelism = {"preprocess": 3}
    assert mb.parallelism == {"preprocess": 3}
    assert [len(mb.thread_groups[s]) for s in HANDLER_METHODS] == [3, 1, 1]
    assert mb(list(range(6)), _context(6)) == [x * 10 + 1 for x in range(6)]
    threads = {name for stage, _, name, _ in handler.seen if stage == "preprocess"}
    assert len(threads) > 1  # six micro-batches of 50 ms over three preprocess threads
    stopped = [w.thread for w in mb.thread_groups["preprocess"][1:]]
    mb.parallelism = {"preprocess": 1}
    assert len(mb.thread_groups["preprocess"]) == 1 and not any(t.is_alive() for t in stopped)
    for wrong in ({"predict": 2}, {"inference": 0}, {"inference": -1}):
        with pytest.raises(ValueError):
            mb.parallelism = wrong


def test_a_stage_that_raises_fails_the_call_and_the_next_call_is_served(stages) -> None:
    handler = stages(fail={50})
    handler.handle.micro_batch_size = 2
    with pytest.raises(RuntimeError, match=r"cannot infer \[50\]"):
        handler.handle(list(range(8)), _context(8))
    postprocessed = {idx for stage, idx, _, _ in handler.seen if stage == "postprocess"}
    assert 2 not in postprocessed  # the failed micro-batch stopped where it failed
    assert handler.handle([1, 2, 3], _context(3)) == [11, 21, 31]
    assert all(w.thread.is_alive() for g in handler.handle.thread_groups.values() for w in g)


def test_two_calls_at_once_collect_their_own_micro_batches(stages) -> None:
    handler = stages(pause_s=0.01)
    handler.handle.parallelism = {"preprocess": 2, "postprocess": 2}
    handler.handle.micro_batch_size = 2
    batches = [list(range(start, start + 10)) for start in range(0, 400, 100)]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda b: handler.handle.handle(b), batches))
    assert answers == [[x * 10 + 1 for x in batch] for batch in batches]


def test_describe_and_a_wrong_micro_batch_size(stages) -> None:
    handler = stages()
    assert handler.handle([1], _context(1, describe="true")) == ['{"described": true}']
    assert handler.seen == []
    handler.handle.micro_batch_size = 0
    with pytest.raises(ValueError, match="micro_batch_size"):
        handler.handle([1], _context(1))
