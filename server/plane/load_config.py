"""A Triton repository load request's ``parameters``: its ``config`` override (Triton's
ModelConfig JSON) as the register overrides and worker count torchbay applies
(``plane/models.py``'s load). Only the fields torchbay serves are taken; anything else, and a
value out of a setting's bounds, is a 400 naming it. Torch-free.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from torchbay.server.config.model_settings import ResponseCacheConfig, check_model_settings
from torchbay.server.errors import BadRequest

# What a load request's ``parameters.config`` may set (Triton ModelConfig JSON fields).
LOAD_CONFIG_KEYS = frozenset(
    {"name", "max_batch_size", "dynamic_batching", "instance_group", "response_cache"}
)
# What it may hold but not change: the archive's, as the model configuration shows them. Triton
# takes a whole config, so its users send back what get_model_config gave, one field changed.
FIXED_CONFIG_KEYS = frozenset(
    {"platform", "backend", "version_policy", "input", "output", "sequence_batching"}
)


def load_overrides(name: str, parameters: Any) -> tuple[dict[str, Any], int | None]:
    """(register overrides, initial workers) from a load request's ``parameters.config``;
    BadRequest for what torchbay does not support."""
    parameters = {} if parameters is None else parameters  # [], "", false: a 400 as Triton's
    if not isinstance(parameters, dict):
        raise BadRequest('"parameters" must be an object')
    unknown = sorted(k for k in parameters if k != "config")
    if unknown:
        raise BadRequest(
            f"Unsupported load parameter(s) {unknown}: torchbay loads archives from its model "
            'store and takes only a "config" override'
        )
    if "config" not in parameters:
        return {}, None
    try:
        config = json.loads(parameters["config"])
    except (TypeError, ValueError, RecursionError):
        raise BadRequest("parameters.config must be a string holding a JSON object") from None
    if not isinstance(config, dict):
        raise BadRequest("parameters.config must be a JSON object")
    unsupported = sorted(set(config) - LOAD_CONFIG_KEYS - FIXED_CONFIG_KEYS)
    if unsupported:
        raise BadRequest(
            f"parameters.config: unsupported field(s) {unsupported}; torchbay takes "
            f"{sorted(LOAD_CONFIG_KEYS)} (and {sorted(FIXED_CONFIG_KEYS)} as they are)"
        )
    if config.get("name", name) != name:
        raise BadRequest(f"parameters.config: name {config['name']!r} is not {name!r}")
    return _config_settings(name, config)


def _batch_size(name: str, max_batch_size: int) -> int:
    """The batch size of Triton's ``max_batch_size``: 0 (no batching) serves one at a time;
    below 0 is refused in Triton's words."""
    if max_batch_size < 0:
        raise BadRequest(f"'max_batch_size' must be non-negative value for {name}")
    return max(1, max_batch_size)


def _config_settings(name: str, config: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    overrides: dict[str, Any] = {}
    workers: int | None = None
    try:
        if "max_batch_size" in config:
            overrides["batch_size"] = _batch_size(name, _whole(config["max_batch_size"]))
        delay = (config.get("dynamic_batching") or {}).get("max_queue_delay_microseconds")
        if delay is not None:
            overrides["max_batch_delay"] = _whole(delay) / 1000
        groups = config.get("instance_group")
        if groups:  # Triton: a group's count below 1 is its default, one instance
            workers = sum(max(1, _whole(g.get("count", 1))) for g in groups)
        if "response_cache" in config:
            overrides["response_cache"] = _response_cache(config["response_cache"])
    except (TypeError, ValueError, AttributeError, OverflowError):  # int() of JSON Infinity
        raise BadRequest(
            "parameters.config: max_batch_size, dynamic_batching.max_queue_delay_microseconds "
            "and instance_group[].count must be whole numbers"
        ) from None
    check_model_settings({**overrides, "initial_workers": workers})
    return overrides, workers


def _whole(value: Any) -> int:
    """An integer field of Triton's ModelConfig as protobuf's JSON parser reads it: a number
    without a fraction, or its text ("16", as Triton's model-control examples send it);
    ValueError for a fraction, a bool, a text with spaces (2.7 was taken as 2, true as 1)."""
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(value)
    if isinstance(value, str) and " " in value:
        raise ValueError(value)
    return int(value)


def _response_cache(value: Any) -> ResponseCacheConfig:
    """Triton's ``response_cache`` (``{"enable": true}``; torchbay's bounds may be given too)."""
    try:
        return ResponseCacheConfig.model_validate(value)
    except ValidationError as exc:
        parts = [
            ".".join(["response_cache", *(str(p) for p in err.get("loc", ()))])
            + f": {err.get('msg')}"
            for err in exc.errors()
        ]
        raise BadRequest("parameters.config: " + "; ".join(parts)) from None


def fixed_fields(parameters: Any) -> dict[str, Any]:
    """The fields of a load's ``parameters.config`` that torchbay cannot change (called once
    ``load_overrides`` accepted the parameters)."""
    if not isinstance(parameters, dict) or "config" not in parameters:
        return {}
    config = json.loads(parameters["config"])
    fixed = {key: config[key] for key in FIXED_CONFIG_KEYS & set(config)}
    batching = _batching_rest(config.get("dynamic_batching"))
    if batching:  # its fields other than the delay: as the configuration shows them
        fixed["dynamic_batching"] = batching
    groups = [_group_rest(g) for g in config.get("instance_group") or ()]
    if any(groups):  # a group's fields other than its count: as the configuration shows them
        fixed["instance_group"] = groups
    return fixed


def _group_rest(group: dict[str, Any]) -> dict[str, Any]:
    """An instance group without its count, and without KIND_AUTO (the server's choice)."""
    return {k: v for k, v in group.items() if k != "count" and (k, v) != ("kind", "KIND_AUTO")}


def _batching_rest(value: Any) -> Any:
    """A ``dynamic_batching`` without the one field a load changes, its queue delay."""
    if not isinstance(value, dict):
        return value
    return {k: v for k, v in value.items() if k != "max_queue_delay_microseconds"}


def check_fixed(fixed: dict[str, Any], served: list[dict[str, Any]]) -> None:
    """BadRequest unless every field of ``fixed`` is what one of the ``served`` model
    configurations (the model's loaded versions) holds: the archive's, which no load changes.
    Dims compare as numbers (gRPC's JSON writes int64 as text)."""
    for key in sorted(fixed):
        if not any(_shown(key, fixed[key], c.get(key)) for c in served):
            why = _WHY.get(key, "it is the archive's")
            raise BadRequest(
                f"parameters.config: {key} cannot change ({why}): {json.dumps(fixed[key])[:200]}"
            )


_WHY = {  # why a field of a load's config cannot change, where it is not the archive's
    "dynamic_batching": "a load changes its max_queue_delay_microseconds alone",
    "instance_group": "a load changes its count alone; the kind is the server's devices'",
}


def _shown(key: str, given: Any, shown: Any) -> bool:
    """Whether ``given`` (a load's field) is what the configuration shows (``shown``); an
    instance group may leave out what the configuration's group has (its name, its kind)."""
    if key != "instance_group":
        return _normal(key, given) == _normal(key, shown)
    group = (shown or [{}])[0]
    return all(g.items() <= group.items() for g in given)


def _normal(key: str, value: Any) -> Any:
    if key in ("sequence_batching", "dynamic_batching"):
        return _numbers(_batching_rest(value) if key == "dynamic_batching" else value)
    if key not in ("input", "output") or not isinstance(value, list):
        return value
    try:
        return [{**t, "dims": [int(d) for d in t.get("dims", [])]} for t in value]
    except (TypeError, ValueError, AttributeError):
        return value


# Enum values that are their field's default: proto3's JSON (gRPC's config) leaves them out.
_ENUM_DEFAULTS = {
    ("kind", "CONTROL_SEQUENCE_START"),
    ("data_type", "TYPE_INVALID"),
    ("timeout_action", "REJECT"),
}


def _numbers(value: Any) -> Any:
    """``value`` with gRPC's JSON undone: int64 and uint64 written as text read as numbers,
    and the fields it leaves out at their defaults (0, false, empty, an enum's first value)
    left out here too."""
    if isinstance(value, dict):
        pairs = [(str(k), _numbers(v)) for k, v in value.items()]  # JSON keys: text
        kept = [(k, v) for k, v in pairs if v not in (0, False, "", None, []) or v == {}]
        return {k: v for k, v in kept if not (isinstance(v, str) and (k, v) in _ENUM_DEFAULTS)}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    if isinstance(value, str) and value.lstrip("-").isdecimal():
        return int(value)
    return value
