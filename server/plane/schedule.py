"""A request's priority and timeout (Triton's schedule-policy extension), read once for every
protocol from the request the adapter built.

* Open Inference Protocol, REST and gRPC: the request's ``parameters`` ``priority`` (0: the
  model's default level, 1 the highest) and ``timeout`` (microseconds), Triton's names. gRPC's
  ``ModelInferRequest.parameters`` reach the plane as the JSON header's ``parameters``
  (grpc/tensors.py), so one reader serves both.
* TorchServe API, REST and gRPC: the headers (gRPC: the call's metadata) ``x-torchbay-priority``
  and ``x-torchbay-timeout-us``, same meanings. TorchServe has no such parameters, and a header
  leaves the body (the handler's) untouched.

A value that is not an integer, or is negative or past its bound, is a 400 naming the parameter;
a priority within the bound that the model has no level for runs at the model's default level,
as on Triton (serving/priority.py). Reading costs a
byte search when the request names neither (a JSON header is parsed only when it may).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torchbay.server.config.queue_policy import MAX_PRIORITY_LEVELS, QueuePolicyConfig
from torchbay.server.errors import TorchbayError
from torchbay.server.plane import json_members, oip_body
from torchbay.server.serving import protocol as p
from torchbay.server.serving.priority import MAX_TIMEOUT_US, NO_SCHEDULE, Schedule, parse_int

PRIORITY_HEADER = "x-torchbay-priority"
TIMEOUT_HEADER = "x-torchbay-timeout-us"
_HEADER_LENGTH = "inference-header-content-length"  # the OIP binary extension's JSON length
_LENGTH_LINE = re.compile(rb"(?:^|\r\n)inference-header-content-length: *(\d+)")
_MARKS = (b'"priority"', b'"timeout"')


def schedule_of(wire: p.WireRequest, limit: int = oip_body.DEFAULT_LIMIT) -> Schedule:
    """The schedule parameters ``wire`` carries (NO_SCHEDULE: none); BadRequest for bad ones.
    ``limit``: the most bytes a compressed OIP body is inflated to (``oip_body.py``)."""
    if wire.protocol == "v2":
        return _from_oip(wire, limit)
    if wire.headers:  # gRPC: the call's metadata, lower-cased
        return _from_headers(wire.headers)
    raw = wire.raw_headers
    if b"x-torchbay-" not in raw:
        return NO_SCHEDULE
    return _from_headers(p.parse_headers(raw))


def _from_headers(headers: Mapping[str, str]) -> Schedule:
    priority, timeout = headers.get(PRIORITY_HEADER), headers.get(TIMEOUT_HEADER)
    if priority is None and timeout is None:
        return NO_SCHEDULE
    return Schedule(
        parse_int("X-Torchbay-Priority", priority, MAX_PRIORITY_LEVELS),
        parse_int("X-Torchbay-Timeout-Us", timeout, MAX_TIMEOUT_US),
    )


def _from_oip(wire: p.WireRequest, limit: int) -> Schedule:
    head = json_header(wire, limit)
    if not any(mark in head for mark in _MARKS):
        return NO_SCHEDULE
    try:
        params: Any = json_members.at_path(head, ("parameters",))  # the tensors are not read
    except (ValueError, RecursionError):
        return NO_SCHEDULE  # not JSON: the worker answers the request's 400
    if not isinstance(params, dict):
        return NO_SCHEDULE
    return Schedule(
        parse_int("priority", params.get("priority"), MAX_PRIORITY_LEVELS),
        parse_int("timeout", params.get("timeout"), MAX_TIMEOUT_US),
    )


def json_header(wire: p.WireRequest, limit: int = oip_body.DEFAULT_LIMIT) -> bytes:
    """The request's JSON: the whole body, or its first ``inference-header-content-length``
    bytes (the binary tensor extension), of the inflated body when it came compressed (empty
    when it does not inflate: the worker answers that request's error)."""
    body = wire.body
    if oip_body.encoding_of(wire) is not None:
        try:
            body = oip_body.inflated(wire, limit)
        except TorchbayError:
            return b""
    length: str | bytes | None = wire.headers.get(_HEADER_LENGTH)
    if length is None and b"inference-header" in wire.raw_headers:
        found = _LENGTH_LINE.search(wire.raw_headers)
        length = found.group(1) if found else None
    try:
        n = int(length) if length is not None else 0
    except ValueError:
        n = 0
    return body[:n] if 0 < n < len(body) else body


def _oip_policy(policy: Any, job_queue_size: int) -> dict[str, Any]:
    """One queue policy as Triton's model config shows it (``max_queue_size`` 0: the model's
    ``jobQueueSize``, which bounds every queue)."""
    return {
        "timeout_action": policy.timeout_action,
        "default_timeout_microseconds": policy.default_timeout_us,
        "allow_timeout_override": policy.allow_timeout_override,
        "max_queue_size": policy.max_queue_size or job_queue_size,
    }


def queue_policies(config: Any, job_queue_size: int) -> dict[str, Any]:
    """``dynamic_batching``'s priority and queue-policy fields of Triton's model config
    (model_config.proto's names) for a ModelConfig (None: the defaults)."""
    default = getattr(config, "default_queue_policy", None) or QueuePolicyConfig()
    out: dict[str, Any] = {"default_queue_policy": _oip_policy(default, job_queue_size)}
    levels = getattr(config, "priority_levels", 0)
    if levels:
        out["priority_levels"] = levels
        out["default_priority_level"] = config.default_priority_level
        out["priority_queue_policy"] = {
            str(level): _oip_policy(policy, job_queue_size)
            for level, policy in sorted(config.priority_queue_policy.items())
        }
    return out
