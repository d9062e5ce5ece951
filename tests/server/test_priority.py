"""Priority levels and queue policies on their own: the queue's order, each level's bound and
timeout (REJECT, DELAY, override rules), admission per level, the schedule parameters every
protocol carries (plane/schedule.py), the settings' bounds and Triton's model-config view.

Timeouts are checked on the queue's own clock by giving requests deadlines already past, never
by sleeping."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import ValidationError

from torchbay.server.config.model_settings import ModelConfig
from torchbay.server.errors import BadRequest, QueueFull, QueueTimeout, RequestTimeout
from torchbay.server.plane.schedule import queue_policies, schedule_of
from torchbay.server.serving import protocol as p
from torchbay.server.serving.admission import Admission
from torchbay.server.serving.autopilot import Window
from torchbay.server.serving.priority import (
    LevelPolicy,
    Levels,
    Schedule,
    level_of,
    levels_from,
    place,
)
from torchbay.server.serving.queue import BatchQueue, Pending, clock


def _queue(levels: Levels | None, batch_size: int = 1, capacity: int = 100) -> BatchQueue:
    return BatchQueue(batch_size=batch_size, max_delay_s=0, capacity=capacity, levels=levels)


def _put(q: BatchQueue, payload: object, priority: int = 0, timeout_us: int | None = None):
    """Admit as ``RequestPath._admit`` does: level, place and timeout, then ``put``."""
    item = Pending(payload, asyncio.get_running_loop().create_future(), clock())
    level = level_of(q.levels, Schedule(priority, timeout_us))
    if q.levels is not None:
        place(item, q.levels, level, timeout_us, item.arrival)
    q.put(item)
    return item


async def _drain(q: BatchQueue) -> list[object]:
    out: list[object] = []
    while len(q):
        out += [item.payload for item in await asyncio.wait_for(q.take(), 5)]
    return out


def _levels(*policies: LevelPolicy, default: int = 1) -> Levels:
    return Levels(list(policies), default, "m")


def test_higher_levels_leave_first_arrival_order_within_a_level():
    async def scenario() -> list[object]:
        q = _queue(_levels(LevelPolicy(), LevelPolicy(), LevelPolicy(), default=2), batch_size=2)
        for payload, priority in [("a3", 3), ("b2", 2), ("c1", 1), ("d0", 0), ("e1", 1)]:
            _put(q, payload, priority)
        assert q.levels.counts == [2, 0, 2, 0, 1, 0]  # priority 0: the default level, 2
        order = await _drain(q)
        assert q.levels.counts == [0] * 6
        return order

    assert asyncio.run(scenario()) == ["c1", "e1", "b2", "d0", "a3"]


def test_one_plain_level_has_no_levels_and_keeps_arrival_order():
    async def scenario() -> list[object]:
        q = _queue(levels_from(ModelConfig(), "m"))
        assert q.levels is None  # the plain queue: append and popleft, as before
        for i in range(4):
            _put(q, i, priority=1 if i % 2 else 0)  # 0 and 1 both name the one level
        assert level_of(None, Schedule(2)) == 0  # and any other (Triton's default level)
        return await _drain(q)

    assert asyncio.run(scenario()) == [0, 1, 2, 3]


def test_each_level_has_its_own_bound():
    async def scenario() -> None:
        q = _queue(_levels(LevelPolicy(max_queue_size=1), LevelPolicy(max_queue_size=2)))
        _put(q, "h1", 1)
        with pytest.raises(QueueFull) as full:
            _put(q, "h2", 1)
        assert full.value.oip_text == "Exceeds maximum queue size"
        assert "level 1" in full.value.message and full.value.headers["retry-after"]
        _put(q, "l1", 2)
        _put(q, "l2", 2)  # level 2's bound is its own
        with pytest.raises(QueueFull):
            _put(q, "l3", 2)
        assert q.full == 2 and len(q) == 3

    asyncio.run(scenario())


def test_reject_answers_503_and_never_dispatches():
    """A level's timeout is Triton's REJECT: UNAVAILABLE (503) "Request timeout expired" (it
    was a 504); an earlier deadline of the request's own (clientTimeoutInMills) stays a 504."""

    async def scenario() -> None:
        policy = LevelPolicy(default_timeout_us=1, allow_override=False)
        q = _queue(_levels(policy, LevelPolicy()), batch_size=4)
        late = _put(q, "late", 1)
        own = _put(q, "own", 2)
        kept = _put(q, "kept", 2)
        late.deadline = late.timeout_at = clock() - 1  # its 1 us timeout has passed (no sleep)
        own.deadline = clock() - 1  # its own deadline passed; level 2 has no timeout
        batch = await asyncio.wait_for(q.take(), 5)
        assert [i.payload for i in batch] == ["kept"]
        rejected = late.future.exception()
        assert isinstance(rejected, QueueTimeout) and rejected.status == 503
        assert rejected.oip_text == "Request timeout expired"
        assert type(own.future.exception()) is RequestTimeout
        assert q.levels.timeouts == [{"REJECT": 1, "DELAY": 0}, {"REJECT": 0, "DELAY": 0}]
        assert late.dispatched is None and kept.dispatched is not None
        assert q.levels.counts == [0, 0, 0, 0]

    asyncio.run(scenario())


def test_delay_moves_a_timed_out_request_behind_its_level_not_below_the_next():
    async def scenario() -> list[object]:
        q = _queue(_levels(LevelPolicy(default_timeout_us=10**9, delay=True), LevelPolicy()))
        slow = _put(q, "delayed", 1)
        _put(q, "live1", 1)
        _put(q, "low", 2)
        assert slow.delay_at is not None and slow.deadline is None
        slow.delay_at = clock() - 1  # its timeout has passed: delayed, not rejected
        order = await _drain(q)
        assert not slow.future.done()  # never answered with an error
        assert q.levels.timeouts[0] == {"REJECT": 0, "DELAY": 1}
        return order

    assert asyncio.run(scenario()) == ["live1", "delayed", "low"]


def test_override_rules():
    assert LevelPolicy(default_timeout_us=100).timeout_us(5) == 100  # not allowed: ignored
    allowed = LevelPolicy(default_timeout_us=100, allow_override=True)
    assert allowed.timeout_us(5) == 5
    assert allowed.timeout_us(500) == 100  # never longer than the default
    assert allowed.timeout_us(None) == 100
    assert LevelPolicy(allow_override=True).timeout_us(500) == 500  # no default: any
    assert LevelPolicy().timeout_us(500) == 0


def test_requeue_and_discard_keep_levels_in_step():
    async def scenario() -> list[object]:
        q = _queue(_levels(LevelPolicy(), LevelPolicy()), batch_size=2)
        gone = _put(q, "gone", 2)
        for payload, priority in [("l", 2), ("h1", 1), ("h2", 1)]:
            _put(q, payload, priority)
        assert q.discard(gone) and q.levels.counts == [2, 0, 1, 0]
        batch = await q.take()
        assert [i.payload for i in batch] == ["h1", "h2"]
        _put(q, "h3", 1)
        q.requeue_front(batch)  # its worker died: first again at its level
        return await _drain(q)

    assert asyncio.run(scenario()) == ["h1", "h2", "h3", "l"]


def test_admission_predicts_the_wait_at_a_level():
    async def scenario() -> None:
        q = _queue(_levels(LevelPolicy(), LevelPolicy()))
        admission = Admission(q, bound_ms=250)
        admission.learn(1, 0.1)  # 100 ms per request
        for _ in range(10):
            _put(q, "low", 2)
        _put(q, "high", 1)
        admission.check(workers=1, busy=1, batch_size=1, level=0)  # 1 ahead: 150 ms, admitted
        admission.check(workers=1, busy=1, batch_size=1)  # the headers: the top level's wait
        with pytest.raises(Exception, match="overloaded"):
            admission.check(workers=1, busy=1, batch_size=1, level=1)  # 11 ahead: 1.05 s
        assert admission.describe()["queueLevels"][1]["queued"] == 10

    asyncio.run(scenario())


def _wire(protocol: str, body: bytes = b"", **headers: str) -> p.WireRequest:
    return p.WireRequest("1", body, protocol=protocol, headers=headers)


def test_schedule_from_each_protocol():
    assert schedule_of(_wire("v2", b'{"inputs": []}')) == Schedule()
    body = json.dumps({"parameters": {"priority": 2, "timeout": 5000}, "inputs": []}).encode()
    assert schedule_of(_wire("v2", body)) == Schedule(2, 5000)
    head = b'{"parameters":{"priority":1}}'
    binary = _wire("v2", head + b'"priority" 9', **{"inference-header-content-length": "29"})
    assert schedule_of(binary) == Schedule(1, None)  # the JSON header only
    raw = p.join_headers([(b"x-torchbay-priority", b"1"), (b"x-torchbay-timeout-us", b"70")])
    rest = p.WireRequest("1", b"", protocol="predict", raw_headers=raw)
    assert schedule_of(rest) == Schedule(1, 70)
    assert schedule_of(_wire("predict", **{"x-torchbay-priority": "3"})) == Schedule(3, None)


@pytest.mark.parametrize(
    ("wire", "field"),
    [
        (_wire("v2", b'{"parameters": {"timeout": -1}}'), "timeout"),
        (_wire("v2", b'{"parameters": {"priority": "high"}}'), "priority"),
        (_wire("v2", b'{"parameters": {"priority": 1.5}}'), "priority"),
        (_wire("v2", b'{"parameters": {"priority": 99}}'), "priority"),
        (_wire("predict", **{"x-torchbay-timeout-us": "-5"}), "X-Torchbay-Timeout-Us"),
        (_wire("predict", **{"x-torchbay-priority": "x"}), "X-Torchbay-Priority"),
    ],
)
def test_bad_schedule_values_are_400s_naming_the_field(wire: p.WireRequest, field: str):
    with pytest.raises(BadRequest, match=f"{field}: must be an integer"):
        schedule_of(wire)


def test_priority_past_the_levels_is_the_default_level(caplog: pytest.LogCaptureFixture):
    """Triton's SetPriority: 0, or a priority above the levels, is the default level (it was a
    400); the first fallback of each priority is logged, naming the level it got."""
    levels = _levels(LevelPolicy(), LevelPolicy(), default=2)
    with caplog.at_level("WARNING", logger="torchbay.model"):
        assert [levels.level_of(p) for p in (0, None, 1, 2, 3, 16, 3)] == [1, 1, 0, 1, 1, 1, 1]
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and "priority 3 runs at its default level 2" in warned[0]
    assert level_of(None, Schedule(priority=16)) == 0  # no levels: one, whatever the priority


def test_settings_are_bounded_and_checked():
    config = ModelConfig.model_validate(
        {
            "priorityLevels": 2,
            "defaultPriorityLevel": 2,
            "defaultQueuePolicy": {"maxQueueSize": 8},
            "priorityQueuePolicy": {
                "1": {"defaultTimeoutMicroseconds": 5, "timeoutAction": "delay"}
            },
        }
    )
    levels = levels_from(config, "m")
    assert levels is not None and levels.default == 1
    assert levels.policies == [
        LevelPolicy(default_timeout_us=5, delay=True),
        LevelPolicy(max_queue_size=8),
    ]
    oip = queue_policies(config, 100)
    assert oip["priority_levels"] == 2 and oip["default_priority_level"] == 2
    assert oip["priority_queue_policy"]["1"]["timeout_action"] == "DELAY"
    assert oip["default_queue_policy"]["max_queue_size"] == 8
    for bad, words in [
        ({"priorityLevels": 17}, "priorityLevels"),
        ({"priorityLevels": 2}, "defaultPriorityLevel must be 1 to priorityLevels"),
        ({"priorityLevels": 1, "defaultPriorityLevel": 1, "priorityQueuePolicy": {"3": {}}}, "3"),
        ({"defaultQueuePolicy": {"defaultTimeoutMicroseconds": -1}}, "defaultTimeoutMicro"),
        ({"defaultQueuePolicy": {"timeoutAction": "DROP"}}, "timeoutAction"),
    ]:
        with pytest.raises(ValidationError, match=words):
            ModelConfig.model_validate(bad)


def test_autopilot_window_judges_the_highest_level_served_often_enough():
    window = Window()
    window.add([0.5, 0.5], 10.0, (1, 1))  # level 2 only so far: its latencies count
    assert window.latencies_ms == [510.0, 510.0]
    window.add([0.02, 0.9], 10.0, (0, 1))  # level 1 appears: the highest served
    window.add([0.9], 10.0, (1,))
    assert window.latencies_ms == [30.0] and window.queue_ms == 20.0
    assert window.served == 5 and window.batches == 3  # every request and batch still counted
    assert window.judge(1) and window.level == 0 and window.latencies_ms == [30.0]
    # level 1 had one request, level 2 four: with 3 samples needed, level 2 is judged
    assert window.judge(3) and window.level == 1
    assert window.latencies_ms == [510.0, 510.0, 910.0, 910.0]
    assert not window.judge(5)  # no level has 5
    plain = Window()
    plain.add([0.1, 0.2], 10.0)  # no levels: every request, as before
    assert plain.latencies_ms == [110.0, 210.0]


def test_levels_count_answers_by_level_and_status_for_describe_and_metrics():
    levels = _levels(LevelPolicy(), LevelPolicy(), default=2)
    for level, status in ((0, 200), (1, 200), (1, 503), (1, 200)):
        levels.answer(level, status)
    described = levels.describe()
    assert [d["requests"] for d in described] == [{"200": 1}, {"200": 2, "503": 1}]
    assert levels.answered == [{200: 1}, {200: 2, 503: 1}]
