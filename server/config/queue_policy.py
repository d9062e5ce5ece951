"""The priority and queue-policy settings of a model (Triton's ``dynamic_batching``): one
:class:`QueuePolicyConfig` per level and the rules that tie them to ``priorityLevels``. The
fields themselves are ``ModelConfig``'s (config.model_settings); the queue that obeys them is
serving/priority.py. Imports nothing of ours.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

MAX_PRIORITY_LEVELS = 16  # a queue scans its levels per request: a handful, never thousands
MAX_QUEUE_SIZE = 1_000_000  # as a model's jobQueueSize
MAX_TIMEOUT_US = 7 * 86_400 * 1_000_000  # a week, as every timeout, in microseconds


class QueuePolicyConfig(BaseModel):
    """Triton's ``ModelQueuePolicy`` for one priority level (or the model's one queue):
    ``maxQueueSize`` (0: only ``jobQueueSize`` bounds it), ``defaultTimeoutMicroseconds`` (0: none),
    ``timeoutAction`` REJECT (503, never run) or DELAY (behind the level's others), and
    ``allowTimeoutOverride`` (a request's own ``timeout``, only a shorter one, counts)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", populate_by_name=True, allow_inf_nan=False
    )

    max_queue_size: int = Field(0, ge=0, le=MAX_QUEUE_SIZE, alias="maxQueueSize")
    default_timeout_us: int = Field(
        0,
        ge=0,
        le=MAX_TIMEOUT_US,
        alias="defaultTimeoutMicroseconds",
        # model_config.proto's name too (a dynamic_batching section, config.model_keys)
        validation_alias=AliasChoices(
            "defaultTimeoutMicroseconds", "default_timeout_microseconds", "default_timeout_us"
        ),
    )
    timeout_action: Literal["REJECT", "DELAY"] = Field("REJECT", alias="timeoutAction")
    allow_timeout_override: bool = Field(False, alias="allowTimeoutOverride")

    @field_validator("timeout_action", mode="before")
    @classmethod
    def _action(cls, value: Any) -> Any:
        return value.strip().upper() if isinstance(value, str) else value


def check_levels(levels: int, default: int, policies: Mapping[int, Any]) -> None:
    """Triton's rules (ValueError): the default level and each policy's level within
    1..``levels``; without levels, no default beyond the one level."""
    if levels and not 1 <= default <= levels:
        raise ValueError(
            f"defaultPriorityLevel must be 1 to priorityLevels ({levels}), got {default}"
        )
    if not levels and default > 1:
        raise ValueError("defaultPriorityLevel needs priorityLevels")
    bad = sorted(k for k in policies if not 1 <= k <= levels)
    if bad:
        raise ValueError(
            f"priorityQueuePolicy names level(s) {bad}, outside 1 to priorityLevels ({levels})"
        )
