"""The sequence scheduler on its own (serving/sequences.py): one request per sequence per batch,
a sequence's affinity to its slot's worker, its order, idle and total limits, the cap on open
sequences, a worker's death, and the plane's parsing of sequence ids (plane/sequence_params.py).

Slots here are plain stand-ins with the three attributes the scheduler reads of a slot
(``worker`` with ``alive`` and ``exited``, ``retiring``, ``gave_up``); the live tests
(test_sequences_live.py) run the real slots and workers."""

from __future__ import annotations

import asyncio
import gc
import json
import weakref

import pytest
from pydantic import ValidationError

from torchbay.server.config.model_keys import split_model_keys
from torchbay.server.config.model_settings import ModelConfig
from torchbay.server.errors import BadRequest, QueueFull, RequestTimeout
from torchbay.server.plane.sequence_params import sequence_of
from torchbay.server.serving import protocol as p
from torchbay.server.serving.queue import Pending, clock
from torchbay.server.serving.sequences import (
    SequenceCancelled,
    SequenceExpired,
    SequenceLost,
    SequenceQueue,
    SequenceRef,
    SequenceRefused,
)


class _Worker:
    def __init__(self) -> None:
        self.alive = True
        self.exited = asyncio.get_running_loop().create_future()

    def die(self) -> None:
        self.alive = False
        self.exited.set_result(-9)


class _Slot:
    def __init__(self) -> None:
        self.worker = _Worker()
        self.retiring = False
        self.gave_up = False


def _queue(**kw) -> SequenceQueue:
    args = {"batch_size": 4, "max_delay_s": 0.0, "capacity": 100, "max_sequences": 8}
    return SequenceQueue(**{**args, "per_sequence": 10, **kw})


def _put(q: SequenceQueue, seq: str | int, payload: object, **flags) -> Pending:
    item = Pending(payload, asyncio.get_running_loop().create_future(), clock())
    q.put(item, SequenceRef(seq, **flags))
    return item


def _answer(batch: list[Pending]) -> None:
    for item in batch:
        item.future.set_result(item.payload)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


async def _closed_after_one(
    q: SequenceQueue, slot: _Slot, sid: str | int, payload: object, **flags: bool
) -> asyncio.Future:
    """``sid``'s one request taken and answered, then ``slot`` taking again (which releases the
    sequence: its idle and total times run on) until the queue closes it; that waiting take."""
    _put(q, sid, payload, **flags)
    _answer(await q.take(slot))
    waiting = asyncio.ensure_future(q.take(slot))
    while str(sid) in q.open:  # the queue keys a sequence by its id as text
        await asyncio.sleep(0.01)
    return waiting


def test_a_batch_holds_one_request_per_sequence_in_order():
    async def scenario() -> list[list[object]]:
        q, slot = _queue(), _Slot()
        for i in range(3):
            _put(q, "a", f"a{i}", start=i == 0)
        _put(q, "b", "b0", start=True)
        batches = []
        for _ in range(3):
            batch = await q.take(slot)
            batches.append([i.payload for i in batch])
            _answer(batch)
        return batches

    assert run(scenario()) == [["a0", "b0"], ["a1"], ["a2"]]


def test_a_sequence_runs_one_request_at_a_time():
    async def scenario() -> bool:
        q, slot = _queue(), _Slot()
        _put(q, "a", 1, start=True)
        _put(q, "a", 2)
        await q.take(slot)  # a's first request runs; its second waits for this take's end
        second = asyncio.ensure_future(q.take(slot))  # (a slot takes again once answered)
        return (await second)[0].payload == 2

    assert run(scenario())


def test_a_request_waiting_for_its_sequence_is_answered_at_its_deadline():
    """A sequence's second request waits while its first runs (no ``take`` looks at it): past
    its deadline it is answered 504 then, not once the first is answered, and never runs."""

    async def scenario() -> tuple[int, int]:
        q, slot = _queue(), _Slot()
        _put(q, "a", 1, start=True)
        assert len(await q.take(slot)) == 1  # a's first request runs
        second = Pending(2, asyncio.get_running_loop().create_future(), clock(), clock() + 0.05)
        q.put(second, SequenceRef("a"))
        with pytest.raises(RequestTimeout) as info:
            await second.future  # the first is still running
        return info.value.status, len(q)

    assert run(scenario()) == (504, 0)


def test_a_sequence_stays_on_its_slot_and_new_ones_go_to_the_least_loaded():
    async def scenario() -> tuple[list, list]:
        q, slots = _queue(), [_Slot(), _Slot()]
        takes = [asyncio.ensure_future(q.take(s)) for s in slots]  # both wait, as at start-up
        await asyncio.sleep(0)
        _put(q, "a", "a0", start=True)
        _put(q, "b", "b0", start=True)  # one each: neither slot may hold both
        firsts = [[i.payload for i in await t] for t in takes]
        a_slot = slots[0] if firsts[0] == ["a0"] else slots[1]
        for _ in range(3):
            _put(q, "a", "a+")
            assert q.open["a"].slot is a_slot
            again = await q.take(a_slot)
            assert [i.payload for i in again] == ["a+"]
        return sorted(firsts), [q.open["a"].slot is a_slot]

    firsts, same = run(scenario())
    assert firsts == [["a0"], ["b0"]] and same == [True]


def test_direct_strategy_holds_batch_size_sequences_per_slot():
    async def scenario() -> tuple[int, int]:
        q, slot = _queue(batch_size=2, strategy="direct"), _Slot()
        for name in "abc":
            _put(q, name, name, start=True)
        batch = await q.take(slot)
        return len(batch), sum(1 for s in q.open.values() if s.slot is None)

    assert run(scenario()) == (2, 1)  # c waits unbound until a lane frees


def test_an_idle_sequence_is_closed_and_its_next_request_refused():
    async def scenario() -> str:
        q, slot = _queue(idle_s=0.05), _Slot()
        waiting = await _closed_after_one(q, slot, 7, "x", start=True)
        waiting.cancel()
        with pytest.raises(SequenceRefused) as info:
            _put(q, 7, "y")
        return info.value.message

    message = run(scenario())
    assert "idling past 50 ms" in message and "sequenceMaxIdleMSec" in message


def test_without_an_idle_limit_a_started_sequence_idles_for_triton_s_default():
    """No ``sequenceMaxIdleMSec``: a sequence opened with ``sequence_start`` (Triton's API)
    closes after Triton's default of 1 s idle, freeing its place of ``maxNumSequence``. Was:
    never, so abandoned sequences kept every place and each new one got 503 for ever."""

    async def scenario() -> tuple[str, float]:
        q, slot = _queue(max_sequences=1), _Slot()
        begun = clock()
        waiting = await _closed_after_one(q, slot, "a", 1, start=True)
        idled = clock() - begun
        _put(q, "b", 1, start=True)  # its place is free
        waiting.cancel()
        with pytest.raises(SequenceRefused) as info:
            _put(q, "a", 2)
        return info.value.message, idled

    message, idled = run(scenario())
    assert "1000 ms" in message and "Triton's default" in message and idled >= 1.0


def test_torchserve_reopens_an_idle_sequence_on_its_living_worker():
    async def scenario() -> bool:
        q, slot = _queue(idle_s=0.05), _Slot()
        waiting = await _closed_after_one(q, slot, "s", 1, implicit=True)
        _put(q, "s", 2, implicit=True)  # TorchServe's API: the id opens again, same worker
        return q.open["s"].slot is slot and (await waiting)[0].payload == 2

    assert run(scenario())


def test_a_sequence_waiting_for_a_slot_past_its_request_timeout_is_answered_503():
    """Triton's ``timeout`` on a sequence model: a sequence that waits for a slot (``direct``:
    every lane taken) past its request's timeout is rejected UNAVAILABLE, its queued
    requests with it, and is not open after (a later request needs a start). A bound
    sequence's requests are not timed out so. Was: the timeout was ignored."""

    async def scenario() -> tuple[str, str, bool, int]:
        q, slot = _queue(batch_size=1, strategy="direct"), _Slot()
        held = _put(q, "a", 1, start=True)
        assert await q.take(slot) == [held]  # a holds the one lane
        item = Pending(1, asyncio.get_running_loop().create_future(), clock())
        q.put(item, SequenceRef("b", start=True), timeout_us=50_000)
        later = _put(q, "b", 2)
        with pytest.raises(SequenceExpired) as info:
            await item.future
        with pytest.raises(SequenceExpired):
            await later.future
        with pytest.raises(SequenceRefused) as refused:
            _put(q, "b", 3)
        bound = Pending(2, asyncio.get_running_loop().create_future(), clock())
        q.put(bound, SequenceRef("a"), timeout_us=1)  # a is bound: no timeout applies
        _answer([held])
        taken = await q.take(slot)
        return info.value.message, refused.value.message, taken == [bound], info.value.status

    message, refused, bound_ran, status = run(scenario())
    assert "timeout" in message and "'b'" in message and status == 503
    assert "timeout" in refused and bound_ran


@pytest.mark.parametrize("strategy", ["oldest", "direct"])
def test_a_request_timeout_does_not_count_while_a_slot_has_room(strategy: str):
    """A slot with room for a new sequence (``oldest``: any; ``direct``: a free lane) that is
    busy with its batch binds it when it next takes: Triton gives such a sequence its slot at
    once, so its request's timeout does not count (no 503 however long the batch runs)."""

    async def scenario() -> list[object]:
        q, slot = _queue(batch_size=2, strategy=strategy), _Slot()
        held = _put(q, "a", 1, start=True)
        assert await q.take(slot) == [held]  # the slot is busy with a's request
        item = Pending("b1", asyncio.get_running_loop().create_future(), clock())
        q.put(item, SequenceRef("b", start=True), timeout_us=1)
        q._sweep(clock() + 1.0)  # a second later: far past the timeout
        assert not item.future.done() and "b" in q.open
        _answer([held])
        return [i.payload for i in await q.take(slot)]

    assert run(scenario()) == ["b1"]


def test_a_sequence_past_its_total_limit_is_closed():
    async def scenario() -> str:
        q, slot = _queue(timeout_s=0.05), _Slot()
        waiting = await _closed_after_one(q, slot, "t", 1, start=True)
        waiting.cancel()
        with pytest.raises(SequenceRefused) as info:
            _put(q, "t", 2)
        return info.value.message

    assert "sequenceTimeoutMSec" in run(scenario())


def test_open_sequences_are_capped_and_an_ended_one_frees_its_place():
    async def scenario() -> bool:
        q, slot = _queue(max_sequences=2), _Slot()
        _put(q, "a", 1, start=True, end=True)
        _put(q, "b", 1, start=True)
        with pytest.raises(QueueFull, match="maxNumSequence"):
            _put(q, "c", 1, start=True)
        _answer(await q.take(slot))
        waiting = asyncio.ensure_future(q.take(slot))  # releases a, which ended
        await asyncio.sleep(0)
        _put(q, "c", 1, start=True)
        waiting.cancel()
        return set(q.open) == {"b", "c"}

    assert run(scenario())


def test_a_dead_worker_fails_its_sequences_queued_and_later_requests():
    async def scenario() -> tuple[bool, str]:
        q, slot = _queue(), _Slot()
        _put(q, "a", 1, start=True)
        await q.take(slot)  # a bound to slot's worker, running
        queued = _put(q, "a", 2)
        slot.worker.die()
        await asyncio.sleep(0)  # the worker's exit callback ends a
        with pytest.raises(SequenceRefused) as info:
            _put(q, "a", 3)
        return isinstance(queued.future.exception(), SequenceLost), info.value.message

    lost, message = run(scenario())
    assert lost and "worker died" in message


def test_a_start_for_an_open_id_runs_after_its_queued_requests_on_its_worker():
    """Triton ends the previous sequence early and begins anew under the id; TorchServe's job
    group takes the request. A start whose worker was replaced (its exit not yet seen) opens a
    new sequence, rather than joining one that is lost."""

    async def scenario() -> tuple[list[object], bool]:
        q, slot, other = _queue(), _Slot(), _Slot()
        _put(q, "a", "a1", start=True)
        _put(q, "a", "a2", end=True)
        _put(q, "a", "b1", start=True)  # an end and the next start, sent without waiting
        order = []
        for _ in range(3):
            batch = await q.take(slot)
            order += [i.payload for i in batch]
            _answer(batch)
        slot.worker = _Worker()  # replaced: a's state is gone
        restart = _put(q, "a", "c1", start=True)
        (taken,) = await q.take(other)  # a new sequence: bound anew, to the least loaded
        return order, taken is restart and not restart.future.done()

    assert run(scenario()) == (["a1", "a2", "b1"], True)


def test_an_end_that_a_start_joined_counts_its_sequence_as_ended():
    """An end and the next start under the id, sent without waiting: two sequences, each
    counted once its end is answered. Was: the first one was never counted (reason=end)."""

    async def scenario() -> list[int]:
        q, slot = _queue(), _Slot()
        _put(q, "a", "a1", start=True)
        _put(q, "a", "a2", end=True)
        _put(q, "a", "b1", start=True)
        counts = []
        for _ in range(2):
            _answer(await q.take(slot))
        waiting = asyncio.ensure_future(q.take(slot))  # a2 answered and released
        await asyncio.sleep(0)
        counts.append(q.ended["end"])
        _put(q, "a", "b2", end=True)
        _answer(await waiting)  # b1
        _answer(await q.take(slot))  # b2
        waiting = asyncio.ensure_future(q.take(slot))
        await asyncio.sleep(0)
        waiting.cancel()
        return [*counts, q.ended["end"]]

    assert run(scenario()) == [1, 2]


@pytest.mark.parametrize("end_running", [False, True])
def test_a_start_that_joined_an_end_and_left_leaves_the_sequence_ended(end_running: bool):
    """A start that joined an open sequence after its end request, whose caller left while it
    was queued, never happened: the sequence ends with its end request, as without it. Was:
    the sequence stayed open (its next request ran on it; its place was kept)."""

    async def scenario() -> tuple[bool, int, str]:
        q, slot = _queue(), _Slot()
        _put(q, "a", "a1", start=True)
        _answer(await q.take(slot))
        end = _put(q, "a", "a2", end=True)
        if end_running:
            assert await q.take(slot) == [end]
        start = _put(q, "a", "b1", start=True)
        start.future.cancel()  # its caller left (RequestPath.finish)
        assert q.discard(start)
        if not end_running:
            assert await q.take(slot) == [end]
        _answer([end])
        waiting = asyncio.ensure_future(q.take(slot))  # releases a2: the sequence ends
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(SequenceRefused) as info:
            _put(q, "a", "a3")
        return "a" in q.open, q.ended["end"], info.value.message

    is_open, ended, message = run(scenario())
    assert not is_open and ended == 1 and "has ended" in message


def test_a_sequence_queue_is_bounded_and_unstarted_ids_refused():
    async def scenario() -> None:
        q = _queue(per_sequence=2)
        _put(q, "a", 1, start=True)
        _put(q, "a", 2)
        with pytest.raises(QueueFull, match="maxSequenceJobQueueSize"):
            _put(q, "a", 3)
        with pytest.raises(SequenceRefused, match="sequence_start"):
            _put(q, "zz", 1)  # Triton: an unknown id needs its start flag

    run(scenario())


def _v2(params: dict) -> p.WireRequest:
    body = json.dumps({"inputs": [], "parameters": params}).encode()
    return p.WireRequest(request_id="1", body=body, protocol="v2")


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({}, "sequence_id"),
        ({"sequence_id": -1}, "sequence_id"),
        ({"sequence_id": 0}, "sequence_id"),
        ({"sequence_id": 1 << 64}, "sequence_id"),
        ({"sequence_id": 1.5}, "sequence_id"),
        ({"sequence_id": True}, "sequence_id"),
        ({"sequence_id": ""}, "sequence_id"),
        ({"sequence_id": 5, "sequence_start": "yes"}, "sequence_start"),
        ({"sequence_id": 5, "sequence_end": 1}, "sequence_end"),
    ],
)
def test_bad_oip_sequence_parameters_are_400s_naming_the_field(params, field):
    with pytest.raises(BadRequest) as info:
        sequence_of(_v2(params))
    assert field in info.value.message and info.value.status == 400


def test_sequence_ids_become_torchserve_headers():
    wire, ref = sequence_of(_v2({"sequence_id": "s1", "sequence_start": True}))
    assert ref == SequenceRef("s1", start=True) and wire.headers["ts_request_sequence_id"] == "s1"
    raw = b"host: x\r\nts_request_sequence_end: false"
    wire, ref = sequence_of(p.WireRequest(request_id="2", body=b"1", raw_headers=raw))
    headers = p.parse_headers(wire.raw_headers)
    assert ref.start and ref.implicit and ref.id.startswith("ts-seq-")  # the server names it
    assert (
        headers["ts_request_sequence_start"] == "true" and "ts_request_sequence_end" not in headers
    )


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("sequenceMaxIdleMSec", -1),
        ("sequenceMaxIdleMSec", 10**15),
        ("sequenceTimeoutMSec", -5),
        ("maxNumSequence", 0),
        ("maxNumSequence", 10**9),
        ("maxSequenceJobQueueSize", 0),
        ("sequenceStrategy", "newest"),
        ("sequenceBatching", "maybe"),
    ],
)
def test_every_sequence_setting_is_bounded(key: str, value: object) -> None:
    with pytest.raises(ValidationError) as info:
        ModelConfig.model_validate({key: value})
    assert key in str(info.value)


def test_triton_s_sequence_batching_section_makes_a_sequence_model() -> None:
    section = {"direct": {}, "max_sequence_idle_microseconds": 5_000_000, "control_input": []}
    fields, backend, _ = split_model_keys(
        {"sequence_batching": section}, where="model-config.yaml", backend_params=True
    )
    config = ModelConfig.model_validate(fields)
    assert config.sequence_mode and config.sequence_strategy == "direct"
    assert config.sequence_max_idle_ms == 5000 and backend["sequence_batching"] == section
    fields, _, _ = split_model_keys(  # TorchServe's keys of the same file win
        {"sequenceMaxIdleMSec": 10, "sequence_batching": {}}, where="x", backend_params=True
    )
    assert ModelConfig.model_validate(fields).sequence_max_idle_ms == 10


@pytest.mark.parametrize(("idle_us", "idle_ms"), [(0, 1000), ("5000000", 5000), (500, 1)])
def test_triton_s_idle_limit_zero_is_its_default_of_a_second(idle_us: object, idle_ms: int):
    """model_config.proto: ``max_sequence_idle_microseconds`` "not specified (or specified as
    zero)" is 1 s (0 was read as a 1 ms limit, closing every sequence between two requests); a
    uint64 that protobuf's JSON wrote as a string counts in microseconds too (it was read as
    milliseconds)."""
    section = {"max_sequence_idle_microseconds": idle_us}
    fields, _, _ = split_model_keys({"sequence_batching": section}, where="x", backend_params=True)
    assert ModelConfig.model_validate(fields).sequence_max_idle_ms == idle_ms


@pytest.mark.parametrize("idle_us", [float("inf"), float("nan"), -5, 1e308])
def test_triton_s_idle_limit_out_of_range_is_the_settings_error(idle_us: float):
    """YAML's ``.inf`` / ``.nan`` raised OverflowError / ValueError here (a registration's 500);
    now ModelConfig refuses them, naming the setting (a 400)."""
    section = {"max_sequence_idle_microseconds": idle_us}
    fields, _, _ = split_model_keys({"sequence_batching": section}, where="x", backend_params=True)
    with pytest.raises(ValidationError, match="sequence_max_idle_ms"):
        ModelConfig.model_validate(fields)


def test_a_cancelled_request_cancels_its_triton_sequence():
    """A queued request whose caller left, of a sequence that Triton's API opened: the
    sequence ends with it, its other queued requests answered cancelled and its next request
    refused until a start, as Triton's sequence batcher (its docs' request_cancellation.md,
    scheduler_test.py's queued sequence cancellation). Was: the request was dropped and the
    sequence went on."""

    async def scenario() -> tuple[BaseException | None, bool, str, int]:
        q, slot = _queue(), _Slot()
        _put(q, "t", "t1", start=True)
        assert len(await q.take(slot)) == 1  # running: its next requests wait
        left, behind = (_put(q, "t", p) for p in ("t2", "t3"))
        left.future.cancel()  # its caller left (RequestPath.finish)
        assert q.cancel(left)
        with pytest.raises(SequenceRefused) as info:
            _put(q, "t", "t4")
        restarted = _put(q, "t", "t5", start=True)
        exc = behind.future.exception()
        return exc, restarted.future.done(), info.value.message, q.ended["cancelled"]

    behind, restarted_done, message, ended = run(scenario())
    assert isinstance(behind, SequenceCancelled) and behind.status == 400
    assert "cancelled" in message and not restarted_done and ended == 1


def test_a_request_whose_caller_left_cancels_its_sequence_before_its_reader_finishes():
    """The caller left (its future cancelled) and a slot takes before the reader's ``finish``
    reaches the queue: the sweep that drops the request cancels its sequence all the same.
    Was: the sweep dropped it alone, and the request behind it ran."""

    async def scenario() -> tuple[list[object], object]:
        q, slot = _queue(), _Slot()
        _put(q, "t", "t1", start=True)
        _answer(await q.take(slot))
        left, behind = (_put(q, "t", p) for p in ("t2", "t3"))
        left.future.cancel()  # no q.cancel yet: the slot's take comes first
        waiting = asyncio.ensure_future(q.take(slot))
        await asyncio.sleep(0)
        taken = [i.payload for i in waiting.result()] if waiting.done() else []
        waiting.cancel()
        return taken, behind.future.done() and behind.future.exception()

    taken, behind = run(scenario())
    assert taken == [] and isinstance(behind, SequenceCancelled), (taken, behind)


def test_a_slot_gone_for_good_is_not_kept():
    """A slot scaled down while it waited in ``take`` (its dispatcher cancelled there): once
    another slot takes, the queue holds it no more. Was: every slot that ever took was kept,
    with its worker, for the model's life (an autopilot scaling up and down leaked them)."""

    async def scenario() -> bool:
        q, old, new = _queue(), _Slot(), _Slot()
        waiting = asyncio.ensure_future(q.take(old))
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.wait([waiting])
        old.retiring = True
        gone = weakref.ref(old)
        del old, waiting
        _put(q, "a", "a1", start=True)
        _answer(await q.take(new))
        gc.collect()
        return gone() is None

    assert run(scenario())


def test_a_cancelled_start_that_joined_a_running_end_counts_both_sequences_once():
    """The end of a sequence runs, the next start under the id waits and is cancelled: the
    first sequence ended by its end (counted ``end`` once), the second was cancelled. Was: the
    first was never counted (its end's answer comes after the id closed)."""

    async def scenario() -> dict[str, int]:
        q, slot = _queue(), _Slot()
        _put(q, "a", "a1", start=True)
        _answer(await q.take(slot))
        _put(q, "a", "a2", end=True)
        end = await q.take(slot)  # a2 runs
        start = _put(q, "a", "b1", start=True)
        start.future.cancel()
        assert q.cancel(start)
        _answer(end)
        waiting = asyncio.ensure_future(q.take(slot))  # a2 answered and released
        await asyncio.sleep(0)
        waiting.cancel()
        return q.ended

    ended = run(scenario())
    assert (ended["end"], ended["cancelled"]) == (1, 1)


def test_a_torchserve_sequence_goes_on_past_a_cancelled_request():
    """TorchServe's API, and a request without a sequence: the request whose caller left never
    happened (discard)."""

    async def scenario() -> tuple[list[object], int]:
        q, slot = _queue(), _Slot()
        _put(q, "ts", "ts1", start=True, implicit=True)
        _answer(await q.take(slot))
        left = _put(q, "ts", "ts2", implicit=True)
        _put(q, "ts", "ts3", implicit=True)
        left.future.cancel()
        assert q.cancel(left)
        alone = Pending("v1", asyncio.get_running_loop().create_future(), clock())
        q.put(alone)  # no sequence (a KServe v1 instance): one of its own, which never happened
        alone.future.cancel()
        assert q.cancel(alone)
        return [item.payload for item in await q.take(slot)], q.ended["cancelled"]

    assert run(scenario()) == (["ts3"], 0)
