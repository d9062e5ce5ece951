"""Continuous batching, the worker's side (TorchServe's ``continuousBatching: true``).

The frontend runs a continuous model one handler call at a time (server/serving/continuous.py).
A request whose previous call said "more to come" is sent again with the next call, its body
left out and its ``protocol`` set to ``CONTINUED`` (the frontend's mark; no client can set it):
the handler sees it with the same request id and headers and an empty row (TorchServe's
"cached in backend" request), and keeps its state under that id (``context.cache`` in
TorchServe's examples).

After each call, the handler's ``context.stopping_criteria`` (one callable per request, as
TorchServe's ``otf_message_handler`` calls them: in request order, with that request's result)
decide each request's ``ts_stream_next`` response header: False from a criterion means more
to come (``"true"``), True the last answer (``"false"``), None no header (one answer). The
frontend reads the header; a handler that sets no criteria answers every request once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger(__name__)

CONTINUED = "continued"  # the protocol of a request the frontend sent again
STREAM_NEXT = "ts_stream_next"  # TorchServe's response header: "true" while more is to come


def continued(request: Any) -> bool:
    """Whether the frontend sent this request again."""
    return getattr(request, "protocol", None) == CONTINUED


def mark_stream_next(context: Any, results: list[Any]) -> None:
    """Set each request's ``ts_stream_next`` from the handler's stopping criteria, if any."""
    criteria = getattr(context, "stopping_criteria", None)
    if not criteria:
        return
    for idx, result in enumerate(results):
        stop = _criterion(criteria, idx)(result)
        if stop is not None:
            context.set_response_header(idx, STREAM_NEXT, "false" if stop else "true")


def _criterion(criteria: Any, idx: int) -> Any:
    """Criterion ``idx`` of a list or a mapping (TorchServe indexes either)."""
    if isinstance(criteria, Mapping):
        return criteria[idx]
    return list(criteria)[idx]
