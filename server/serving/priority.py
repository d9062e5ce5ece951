"""Priority levels and queue policies of one model version (Triton's schedule-policy extension).

A request names its ``priority`` (0: the model's default level; 1 is the highest) and may name a
``timeout`` in microseconds (:class:`Schedule`). A model with ``priorityLevels`` N has N levels,
each with its queue policy (:class:`LevelPolicy`: ``maxQueueSize``, ``defaultTimeoutMicroseconds``,
``timeoutAction``, ``allowTimeoutOverride``); a model without has one level, and a queue policy
only when ``defaultQueuePolicy`` sets one.

The queue (serving/queue.py) keeps one deque, ordered by *place*: level 1's live requests, then
level 1's delayed ones, then level 2's live, ... (a request past its timeout under ``DELAY`` waits
behind every live request of its own and higher levels, as Triton's). :class:`Levels` counts the
requests at each place, so that a newcomer is inserted behind its own place in one step and
admission can ask how many requests wait ahead of a given level. A model with neither levels nor
a policy has no ``Levels``: its queue appends and pops exactly as before.

Torch-free; it imports no model code.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from torchbay.server.config.queue_policy import MAX_TIMEOUT_US, QueuePolicyConfig
from torchbay.server.errors import BadRequest

log = logging.getLogger("torchbay.model")
__all__ = [
    "MAX_TIMEOUT_US",
    "NO_SCHEDULE",
    "LevelPolicy",
    "Levels",
    "Schedule",
    "level_of",
    "levels_from",
    "parse_int",
    "place",
    "settle",
]


@dataclass(frozen=True, slots=True)
class LevelPolicy:
    """Triton's ``ModelQueuePolicy`` for one level."""

    max_queue_size: int = 0  # 0: no bound of its own (the model's job_queue_size still holds)
    default_timeout_us: int = 0  # 0: no timeout
    delay: bool = False  # timeoutAction DELAY (else REJECT: answered 504, never run)
    allow_override: bool = False  # a request's own timeout counts (only a shorter one)

    def timeout_us(self, requested: int | None) -> int:
        """The timeout a request at this level gets (0: none). Its own only when the policy
        allows an override, and then never longer than the default (Triton's rule)."""
        if self.allow_override and requested:
            default = self.default_timeout_us
            return requested if default == 0 else min(requested, default)
        return self.default_timeout_us


@dataclass(frozen=True, slots=True)
class Schedule:
    """One request's schedule parameters, as its protocol carried them (None: not given)."""

    priority: int | None = None
    timeout_us: int | None = None


NO_SCHEDULE = Schedule()


def _policy(config: QueuePolicyConfig | None) -> LevelPolicy:
    if config is None:
        return LevelPolicy()
    return LevelPolicy(
        max_queue_size=config.max_queue_size,
        default_timeout_us=config.default_timeout_us,
        delay=config.timeout_action == "DELAY",
        allow_override=config.allow_timeout_override,
    )


def levels_from(config: Any, name: str = "") -> Levels | None:
    """A model version's levels from its ModelConfig (None: no levels and no queue policy, the
    plain queue). Each level's policy is ``priorityQueuePolicy``'s, else ``defaultQueuePolicy``."""
    if config is None or (not config.priority_levels and config.default_queue_policy is None):
        return None
    count = max(1, config.priority_levels)
    policies = [
        _policy(config.priority_queue_policy.get(level, config.default_queue_policy))
        for level in range(1, count + 1)
    ]
    return Levels(policies, max(1, config.default_priority_level), name)


def parse_int(field: str, value: Any, upper: int) -> int | None:
    """A schedule parameter as an integer 0..upper, or BadRequest naming ``field``. Accepts an
    int, an integral float (JSON ``5.0``) or a decimal string (a header); None stays None."""
    if value is None:
        return None
    number: Any = value
    if isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            number = None
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        number = int(value)
    if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number <= upper:
        raise BadRequest(
            f"Invalid parameter(s): {field}: must be an integer from 0 to {upper}, "
            f"got {str(value)[:32]!r}"
        )
    return number


class Levels:
    """The levels of one queue: each one's policy and the requests queued at each place (two
    places per level: live, then delayed). Level indexes here are 0-based (Triton's 1 is 0)."""

    __slots__ = (
        "answered",
        "counts",
        "default",
        "delays",
        "fallbacks",
        "name",
        "policies",
        "timeouts",
    )

    def __init__(self, policies: list[LevelPolicy], default_level: int, name: str = "") -> None:
        if not policies or not 1 <= default_level <= len(policies):
            raise ValueError("default_level must be 1 to the number of levels")
        self.policies = policies
        self.default = default_level - 1
        self.counts = [0] * (2 * len(policies))
        self.name = name
        self.delays = any(p.delay for p in policies)  # whether ``settle`` has anything to do
        # Requests answered at each level, by status (describe, observe/priority_metrics.py).
        self.answered: list[dict[int, int]] = [{} for _ in policies]
        self.fallbacks: set[int] = set()  # priorities past the levels already logged (<= 16)
        # Requests whose level's timeout passed while queued, by level and action: REJECT
        # (answered 503, as a full level's refusals are) and DELAY (moved behind).
        self.timeouts: list[dict[str, int]] = [{"REJECT": 0, "DELAY": 0} for _ in policies]

    def __len__(self) -> int:
        return len(self.policies)

    def level_of(self, priority: int | None) -> int:
        """The 0-based level of a request's priority: 0 or None, or a priority past the levels
        (Triton's ``SetPriority``), is the default level; the first time a priority falls back
        so, a warning names it and the level it got."""
        if not priority:
            return self.default
        if priority > len(self.policies):
            if priority not in self.fallbacks:
                self.fallbacks.add(priority)
                log.warning(
                    "Model %s has %d priority levels: a request's priority %d runs at its "
                    "default level %d",
                    self.name,
                    len(self.policies),
                    priority,
                    self.default + 1,
                )
            return self.default
        return priority - 1

    def insert_at(self, place: int) -> int:
        """The deque index behind the last request queued at ``place`` (then counted there)."""
        index = sum(self.counts[: place + 1])
        self.counts[place] += 1
        return index

    def front_of(self, place: int) -> int:
        """The deque index before the first request at ``place`` (then counted there)."""
        index = sum(self.counts[:place])
        self.counts[place] += 1
        return index

    def queued_at(self, level: int) -> int:
        """Requests waiting at ``level`` (0-based), live and delayed."""
        return self.counts[2 * level] + self.counts[2 * level + 1]

    def ahead_of(self, level: int) -> int:
        """Requests that a newcomer at ``level`` waits behind: those at its level and above."""
        return sum(self.counts[: 2 * level + 2])

    def answer(self, level: int, status: int) -> None:
        """One request of ``level`` (0-based) answered with ``status`` (refusals included)."""
        codes = self.answered[level]
        codes[status] = codes.get(status, 0) + 1

    def recount(self, items: Iterable[Any]) -> None:
        """Count afresh from the queued items (their ``place``), after a bulk change."""
        counts = [0] * len(self.counts)
        for item in items:
            counts[item.place] += 1
        self.counts = counts

    def describe(self) -> list[dict[str, Any]]:
        """Each level's queue depth and policy (describe-model), level 1 first."""
        return [
            {
                "level": i + 1,
                "queued": self.queued_at(i),
                "requests": {str(code): n for code, n in sorted(self.answered[i].items())},
                "timeouts": dict(self.timeouts[i]),
                "maxQueueSize": p.max_queue_size,
                "defaultTimeoutMicroseconds": p.default_timeout_us,
                "timeoutAction": "DELAY" if p.delay else "REJECT",
                "allowTimeoutOverride": p.allow_override,
            }
            for i, p in enumerate(self.policies)
        ]


def settle(items: Any, levels: Levels, now: float) -> None:
    """Move each live request whose DELAY timeout has passed behind every live request of its
    level (to the end of its level's delayed place, as Triton's delayed queue); ``items`` is the
    queue's deque, ``levels`` its counts (kept in step). Linear per request moved."""
    if not levels.delays:
        return
    due = [p for p in items if p.delay_at is not None and p.delay_at <= now]
    for p in due:
        items.remove(p)
        levels.counts[p.place] -= 1
        p.place |= 1
        p.delay_at = None
        levels.timeouts[p.place // 2]["DELAY"] += 1
        items.insert(levels.insert_at(p.place), p)


def level_of(levels: Levels | None, schedule: Schedule) -> int:
    """The 0-based level of a request. A model without levels has one, whatever its priority
    (Triton's: a priority past a model's levels is its default level)."""
    if levels is not None:
        return levels.level_of(schedule.priority)
    return 0


def place(item: Any, levels: Levels, level: int, timeout_us: int | None, now: float) -> None:
    """Give a just-admitted ``item`` its place and its level's timeout (REJECT: a deadline, the
    earlier of it and any the request has, answered 503 when it is the level's; DELAY: the time
    it moves behind)."""
    item.place = 2 * level
    policy = levels.policies[level]
    timeout = policy.timeout_us(timeout_us)
    if timeout:
        at = now + timeout / 1_000_000
        if policy.delay:
            item.delay_at = at
        else:
            item.timeout_at = at  # 503 at it (QueueTimeout), 504 at an earlier deadline
            item.deadline = at if item.deadline is None else min(item.deadline, at)
