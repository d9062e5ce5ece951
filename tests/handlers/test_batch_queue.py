"""The batching queue at c=1 (here beside the batch tests this helper owns; it tests
server/serving/queue.py): a closed-loop single client's batches stop paying for probes."""

from __future__ import annotations

import asyncio

from torchbay.server.serving.queue import BatchQueue, Pending, clock


def test_probes_back_off_when_nothing_ever_arrives_while_waiting() -> None:
    """Batch 8 at c=1: each probe waits the whole window and gains nothing. Before, a probe
    came every ``probe_interval`` (here: before every one of the 12 batches); now the interval
    doubles per fruitless probe, so only a few batches wait (log2 of the elapsed time)."""

    async def scenario() -> int:
        loop = asyncio.get_running_loop()
        q: BatchQueue = BatchQueue(
            batch_size=8, max_delay_s=0.2, capacity=10, probe_interval_s=0.01
        )
        waited = 0
        for i in range(12):
            q.put(Pending(i, loop.create_future(), clock(), None))
            started = clock()
            batch = await asyncio.wait_for(q.take(), 5)
            assert [p.payload for p in batch] == [i]
            waited += clock() - started >= 0.15
            await asyncio.sleep(0.01)  # the one client's next request follows its answer
        return waited

    assert run(scenario()) <= 8


def run(coro):
    return asyncio.run(coro)
