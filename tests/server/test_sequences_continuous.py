"""The continuous-batching sequence scheduler on its own (serving/continuous.py): a slot that
holds continued requests takes without waiting, a streaming sequence's next request joins the
next call, the room left is twice the batch size less the continued requests, a streaming
sequence is not closed for idling, and a handler's end closes its sequence. The settings'
rule that ``continuousBatching`` needs ``sequenceBatching`` is here too. Slots are the plain
stand-ins of test_sequences.py; test_sequences_continuous_live.py runs the real ones."""

from __future__ import annotations

import asyncio

import pytest

from torchbay.server.config.model_keys import split_model_keys
from torchbay.server.serving.continuous import ContinuousSequenceQueue, ended_sequences
from torchbay.server.serving.queue import clock
from torchbay.server.serving.sequences import SequenceRefused

from .test_sequences import _put, _Slot, run


def _queue(**kw) -> ContinuousSequenceQueue:
    args = {"batch_size": 2, "max_delay_s": 0.0, "capacity": 100, "max_sequences": 8}
    return ContinuousSequenceQueue(**{**args, "per_sequence": 10, **kw})


def test_with_continued_requests_take_returns_at_once_even_empty():
    async def scenario() -> tuple[list, list]:
        q, slot = _queue(), _Slot()
        first = _put(q, "a", "a0", start=True)
        assert await q.take(slot) == [first]
        q.streaming(first)  # it answered a part and goes on
        empty = await q.take(slot, carried=1)  # nothing new: no wait
        _put(q, "a", "a1")  # the sequence's cancel, say
        joined = await q.take(slot, carried=1)
        return [i.payload for i in empty], [i.payload for i in joined]

    assert run(scenario()) == ([], ["a1"])


def test_the_room_is_twice_the_batch_size_less_the_continued_requests():
    async def scenario() -> list[int]:
        q, slot = _queue(), _Slot()
        for name in "abcde":
            _put(q, name, f"{name}0", start=True)
        fresh = await q.take(slot)  # 2 x batch size 2
        after = await q.take(slot, carried=3)  # room for 1
        return [len(fresh), len(after)]

    assert run(scenario()) == [4, 1]


def test_a_streaming_sequence_is_not_closed_for_idling_and_ends_when_its_handler_says():
    async def scenario() -> tuple[int, int]:
        q, slot = _queue(idle_s=0.01), _Slot()
        item = _put(q, "a", "a0", start=True)
        await q.take(slot)
        q.streaming(item)
        await q.take(slot, carried=1)  # releases the sequence: only its stream holds it
        q._sweep(clock() + 1.0)  # a second later: far past the idle limit
        still_open = len(q.open)
        q.answered(item)
        q.finish("a")  # the handler's ts_request_sequence_end
        return still_open, len(q.open)

    assert run(scenario()) == (1, 0)


def test_a_request_after_the_handler_ended_its_sequence_is_refused():
    async def scenario() -> None:
        q, slot = _queue(), _Slot()
        _put(q, "a", "a0", start=True)
        await q.take(slot)
        q.finish("a")
        await q.take(slot, carried=1)  # the call is answered: the sequence closes
        with pytest.raises(SequenceRefused, match="has ended"):
            _put(q, "a", "a1", start=False)

    run(scenario())


def test_a_start_queued_before_the_handler_ends_its_sequence_begins_a_new_one():
    """A client's next conversation under the id, sent while the last request of the one
    before runs, joins it (as in Triton and TorchServe): the handler's end is the one
    before's. Was: the new sequence ended after its first request, and its next was refused
    (400 "has ended")."""

    async def scenario() -> list[object]:
        q, slot = _queue(), _Slot()
        _put(q, "a", "a0", start=True)
        await q.take(slot)  # a0 runs
        _put(q, "a", "b0", start=True)
        q.finish("a")  # the handler ends the sequence a0 belongs to
        taken = [i.payload for i in await q.take(slot)]
        _put(q, "a", "b1")
        return taken + [i.payload for i in await q.take(slot)]

    assert run(scenario()) == ["b0", "b1"]


@pytest.mark.parametrize("leaves", [False, True])
def test_a_handler_s_end_before_a_queued_start_counts_and_stands_if_the_start_leaves(leaves):
    """The handler ends a sequence while a start under its id is queued: that sequence counts
    as ended (reason end) once its request is answered; should the start's caller leave
    before it runs, the sequence is over (its next request refused). Was: never counted, and
    the sequence stayed open without the start."""

    async def scenario() -> tuple[int, bool]:
        q, slot = _queue(), _Slot()
        _put(q, "a", "a0", start=True)
        (first,) = await q.take(slot)  # a0 runs
        start = _put(q, "a", "b0", start=True)
        q.finish("a")  # the handler ends the sequence a0 belongs to
        if leaves:
            start.future.cancel()
            assert q.discard(start)
        first.future.set_result(None)
        waiting = asyncio.ensure_future(q.take(slot))  # releases a0
        await asyncio.sleep(0)
        if leaves:
            with pytest.raises(SequenceRefused):
                _put(q, "a", "a1")
        waiting.cancel()
        return q.ended["end"], "a" in q.open

    assert run(scenario()) == (1, not leaves)


def test_a_handler_s_end_header_names_one_sequence_whose_id_holds_a_semicolon():
    """TorchServe joins the ids a handler ended with ``;``; a client whose own sequence id holds
    one (``victim;x``) ended the sequence ``victim`` of another client with its own end."""

    async def scenario() -> tuple[list[str], list[str], list[str]]:
        q = _queue()
        for seq in ("victim", "victim;x", "a", "b"):
            _put(q, seq, f"{seq}0", start=True)
        return (
            ended_sequences("victim;x", q.open),
            ended_sequences("a;b", q.open),
            ended_sequences(" a ; gone;", q.open),
        )

    assert run(scenario()) == (["victim;x"], ["a", "b"], ["a", "gone"])


def test_continuous_batching_needs_sequence_batching():
    fields, _, notes = split_model_keys(
        {"continuousBatching": True, "batchSize": 4}, where="model-config.yaml", backend_params=True
    )
    assert "continuous_batching" not in fields
    assert any("continuousBatching" in n and "sequenceBatching" in n for n in notes)
    fields, _, notes = split_model_keys(
        {"continuousBatching": True, "sequenceBatching": True},
        where="model-config.yaml",
        backend_params=True,
    )
    assert fields["continuous_batching"] is True and not notes
