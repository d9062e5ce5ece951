"""Refusal at the headers: the inference listener's 503 for a request whose model version is
refusing newcomers, answered by the HTTP protocol itself before the request has an ASGI task.

Under overload most requests are refused, and each refusal cost the frontend a whole ASGI
request: uvicorn's task, the app's routing and two ASGI sends on top of what any answer costs
(parsing, the error's JSON, the write, metrics and the access line). Answered from the protocol,
a refusal costs about 16% less CPU (48 KiB bodies, closed loop: 68 -> 57 us median) and the
frontend about 2 points of a core less under 4x overload (benchmarks/RESULTS.md). That CPU
comes out of the workers' share of the host.

``server.http.limits`` calls :func:`at_headers` (through ``InferenceApp.at_headers``) when a
request's headers are complete. It answers only when the request's model version is *pressed*
(``Admission.pressed``: it refused a request in the last ``PRESSURE_S``) and
the data plane's ``refusal`` refuses this one too: the same decision, counted and recorded
(metrics, Triton statistics, access line) as the ASGI path does it, by the plane. Everything else
(an unknown route or model, a missing key, an admitted request) goes on to the ASGI app as
before, with the route already resolved (``ROUTED`` in the scope). While no model version of the
process refuses (``admission.any_pressed``), it returns at once: one clock read per request.
Torch-free.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from torchbay.server.errors import TorchbayError
from torchbay.server.http.asgi import Answer, Scope, error_answer
from torchbay.server.plane import any_pressed

log = logging.getLogger("torchbay.http")
Match = re.Match[str]
ROUTED = "torchbay.routed"  # the scope key of at_headers' route, popped by InferenceApp


def v2_model(match: Match) -> tuple[str, str | None]:
    """The Open Inference Protocol's ``{model_name}[/versions/{model_version}]``. A route's
    parameters are the path's, which the HTTP server has percent-decoded once (as TorchServe
    and the management API decode it): never decoded again."""
    params = match.groupdict()
    version = params.get("model_version")
    return params["model_name"], version


def ts_model(match: Match) -> tuple[str, str | None]:
    """TorchServe's ``{model}[/{version}]``: an empty version is the default one, unless
    further segments follow it (``/predictions/m//x``: the version ``""``, TorchServe's 404), as
    Java's split drops trailing empty segments only."""
    params = match.groupdict()
    version = params.get("model_version")
    if not version and not (params.get("url_path") or "").strip("/"):
        version = None
    return params["model_name"], version


# The endpoints whose requests may be refused at the headers, and the model version each names.
MODEL_OF: dict[str, Callable[[Match], tuple[str, str | None]]] = {
    "predict": ts_model,
    "explain": ts_model,
    "v2_infer": v2_model,
    "generate": v2_model,
    "generate_stream": v2_model,
    "kserve_v1": lambda match: (match["model_name"], None),
    "kserve_v1_explain": lambda match: (match["model_name"], None),
    "invoke": lambda match: (match["model_name"], None),
}


def at_headers(app: Any, scope: Scope) -> Answer | None:
    """The refusal to send now for ``scope`` on ``app`` (an InferenceApp), or None. A bug here
    is logged and the request goes on to the ASGI path (raised inside the HTTP parser's
    callback, it would read as a malformed request)."""
    if not any_pressed():
        return None  # nothing refuses: the ASGI path, untouched (the hot path's one check)
    try:
        return _refusal(app, scope)
    except Exception:
        log.exception("answering %s %s from its headers failed", scope["method"], scope["path"])
        return None


def _refusal(app: Any, scope: Scope) -> Answer | None:
    try:
        found = app.router.resolve(scope["path"], scope["method"])
    except TorchbayError:
        return None
    scope[ROUTED] = found
    route, _endpoint, match = found
    model_of = MODEL_OF.get(route.endpoint)
    if model_of is None:
        return None
    name, version = model_of(match)
    plane = app.plane
    mv = plane.pressed(name, version)
    if mv is None:
        return None  # not refusing, or unknown: the ASGI path answers it as always
    if app.authorize is not None:
        try:
            app.authorize(scope, "inference")
        except TorchbayError:
            return None  # 401: the ASGI path answers it as always
    refused = plane.refusal(scope, mv, name, version)
    if refused is None:
        return None
    status, headers, body = error_answer(refused, oip=route.oip)
    return status, headers, b"" if scope["method"] == "HEAD" else body  # HEAD: the head only
