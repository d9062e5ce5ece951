"""Which keys of a model-config.yaml (or a ``models={...}`` entry) are model settings, which
are the handler's, and which TorchServe keys torchbay reads and ignores; Triton's
``sequence_batching`` section read as the sequence settings, its ``dynamic_batching`` section as
the priority, queue-policy and batch-delay settings. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from torchbay.server.config.model_settings import SETTINGS, ModelConfig

# TorchServe frontend keys of model-config.yaml / models={...} that torchbay accepts and ignores.
MODEL_IGNORED_KEYS = frozenset(
    {
        "parallelType",
        "parallelLevel",
        "parallelization",
        "torchrun",
        "useJobTicket",
        "asyncCommunication",
        "useVenv",
        "stateful",
        "runtimeType",
        "runtime",
    }
)
MODEL_ALIASES = {s.yaml_key: name for name, s in SETTINGS.items() if s.yaml_key is not None}


def split_model_keys(
    raw: Mapping[str, Any], *, where: str, backend_params: bool
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """Split TorchServe model settings into (fields, backend parameters, notes)."""
    fields: dict[str, Any] = {}
    backend: dict[str, Any] = {}
    notes: list[str] = []
    for key, value in raw.items():
        field = MODEL_ALIASES.get(key, key if key in ModelConfig.model_fields else None)
        if backend_params and key in ("handler", "handler_config"):
            field = None  # in model-config.yaml, `handler:` is a backend-parameter section
        if field is not None:
            fields[field] = value
        elif key in MODEL_IGNORED_KEYS:
            notes.append(f"{where}: ignored TorchServe key {key!r} (not used by torchbay)")
        elif backend_params:
            backend[key] = value
        else:
            notes.append(f"{where}: ignored unknown key {key!r}")
    if backend_params:
        _triton_sequences(backend.get("sequence_batching"), fields)
        _triton_batching(backend.get("dynamic_batching"), fields)
    if fields.get("continuous_batching") is True and fields.get("sequence_mode") is not True:
        del fields["continuous_batching"]  # serving/continuous.py serves sequence models only
        notes.append(f"{where}: ignored 'continuousBatching' (only with sequenceBatching: true)")
    return fields, backend, notes


def _triton_sequences(section: Any, fields: dict[str, Any]) -> None:
    """Triton's ``sequence_batching`` section of a model-config.yaml (model_config.proto's form,
    kept for the worker's control inputs) makes a sequence model too: its strategy (``direct``
    or ``oldest``) and ``max_sequence_idle_microseconds`` (Triton's default: 1 s) set the
    sequence settings that TorchServe's keys of the same file did not set."""
    if not isinstance(section, Mapping):
        return
    fields.setdefault("sequence_mode", True)
    fields.setdefault("sequence_strategy", "direct" if "direct" in section else "oldest")
    idle_us = section.get("max_sequence_idle_microseconds", 0)
    fields.setdefault("sequence_max_idle_ms", _idle_ms(idle_us))


def _triton_batching(section: Any, fields: dict[str, Any]) -> None:
    """Triton's ``dynamic_batching`` section of a model-config.yaml (model_config.proto's form):
    its priority levels and queue policies (model_config.proto's names, which ModelConfig
    reads too) and ``max_queue_delay_microseconds`` set the settings that TorchServe's keys of
    the same file did not set. It was left to the handler alone: a Triton user's levels and
    timeouts never applied, and nothing said so."""
    if not isinstance(section, Mapping):
        return
    for key in _LEVEL_KEYS:
        if key in section:
            fields.setdefault(key, section[key])
    delay_us = section.get("max_queue_delay_microseconds")
    if delay_us is not None:
        fields.setdefault("max_batch_delay_ms", _ms(delay_us))


_LEVEL_KEYS = (
    "priority_levels",
    "default_priority_level",
    "default_queue_policy",
    "priority_queue_policy",
)


def _ms(us: Any) -> Any:
    """Microseconds (a uint64: protobuf's JSON writes it as a string of digits) in
    milliseconds; anything else is passed on as it is, for ModelConfig's 400 naming it."""
    if isinstance(us, str) and us.strip().isdecimal():
        us = int(us)
    if isinstance(us, bool) or not isinstance(us, int):
        return us
    return us / 1000


def _idle_ms(idle_us: Any) -> Any:
    """Triton's ``max_sequence_idle_microseconds`` (a uint64: protobuf's JSON writes it as a
    string of digits) in milliseconds: 0 is Triton's default, 1 s; a sub-millisecond limit is
    the shortest one. Anything else (negative, not finite, not a number) is passed on as it
    is, for ModelConfig's 400 naming the setting."""
    if isinstance(idle_us, str) and idle_us.strip().isdecimal():
        idle_us = int(idle_us)
    if isinstance(idle_us, bool) or not isinstance(idle_us, int | float):
        return idle_us
    if not math.isfinite(idle_us) or idle_us < 0:
        return idle_us
    return max(int(idle_us or 1_000_000) // 1000, 1)
