"""The raw ASGI listeners' route tables: each route once, with what its dispatch needs (methods,
path template, endpoint) and what its OpenAPI entry needs (summary, statuses, schemas, auth).

:class:`Router` compiles a table for dispatch (a dict on the first path segment, then one
precompiled regex per path); ``server.http.openapi`` renders the same table as the document.
A path template's ``{name}`` matches one non-empty segment (an empty one on TorchServe's
``/predictions`` and ``/explanations``, as TorchServe splits them); ``suffix`` routes also take
further segments (``/predictions/m/v/more/path`` -> ``url_path``). Torch-free.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torchbay.server.errors import MethodNotAllowed, NotFound
from torchbay.server.http.asgi import Receive, Scope, Send

# An endpoint gets the path's match (its named groups are the template's parameters).
Endpoint = Callable[[Scope, Receive, Send, "re.Match[str]"], Awaitable[None]]
# (description, JSON schema, or the content type of a body that is not JSON)
Answer = tuple[str, "dict[str, Any] | str"]

ROUTE_NOT_FOUND = "Requested resource is not found, please refer to API document."


@dataclass(frozen=True)
class Route:
    """One operation: ``method`` on ``path`` answered by the endpoint named ``endpoint``."""

    method: str
    path: str
    endpoint: str
    summary: str
    errors: tuple[int, ...] = ()  # statuses answered with the error schema
    answers: Mapping[str, Answer] = field(default_factory=dict)  # other statuses
    oip: bool = False  # errors are OIP's {"error"}; else TorchServe's {"code","type","message"}
    auth: bool = False  # needs a key (token authorization on): ``key``'s
    key: str = "inference"  # which key ``auth`` asks for: "inference" or "management"
    body: Mapping[str, Any] | None = None  # the OpenAPI requestBody
    description: str | None = None
    query: tuple[Mapping[str, Any], ...] = ()  # OpenAPI query parameters
    suffix: bool = False  # further path segments are taken (as ``url_path``)
    empty_segments: bool = False  # a path parameter may be empty
    strict: bool = False  # another method on this path is 405 (else 404)

    def params(self) -> list[str]:
        return re.findall(r"\{(\w+)\}", self.path)


def _pattern(route: Route) -> re.Pattern[str]:
    segment = "[^/]*" if route.empty_segments else "[^/]+"
    parts = re.split(r"\{(\w+)\}", route.path)
    regex = "".join(
        re.escape(part) if i % 2 == 0 else f"(?P<{part}>{segment})" for i, part in enumerate(parts)
    )
    if route.suffix:
        regex += "(?:/(?P<url_path>.*))?"
    if route.oip:
        regex += "/*"  # OIP paths take trailing slashes
    return re.compile(regex + r"\Z")


def first_segment(path: str) -> str:
    end = path.find("/", 1)
    return path[1:end] if end > 0 else path[1:]


class Router:
    """A table's dispatch: ``resolve(path, method)`` -> (route, endpoint, match), or NotFound
    (no route's path matches) or MethodNotAllowed (a ``strict`` path, another method)."""

    def __init__(
        self,
        routes: tuple[Route, ...],
        endpoints: Mapping[str, Endpoint],
        *,
        oip_prefix: str | None = None,  # unrouted paths under it: OIP's "No route for" message
    ) -> None:
        self._oip_prefix = oip_prefix
        # first segment -> [(pattern, {method: (route, endpoint)}, strict)], in table order
        self._paths: dict[str, list[tuple[re.Pattern[str], dict[str, Any], bool]]] = {}
        seen: dict[str, dict[str, Any]] = {}
        for route in routes:
            methods = seen.get(route.path)
            if methods is None:
                methods = seen[route.path] = {}
                bucket = self._paths.setdefault(first_segment(route.path.split("{")[0]), [])
                bucket.append((_pattern(route), methods, route.strict))
            methods[route.method] = (route, endpoints[route.endpoint])

    def resolve(self, path: str, method: str) -> tuple[Route, Endpoint, re.Match[str]]:
        for pattern, methods, strict in self._paths.get(first_segment(path), ()):
            match = pattern.match(path)
            if match is None:
                continue
            found = methods.get(method)
            if found is not None:
                return found[0], found[1], match
            if strict:
                raise MethodNotAllowed(f"{method} is not allowed on {path}")
        oip = self._oip_prefix is not None and path.startswith(self._oip_prefix)
        raise NotFound(f"No route for {method} {path}" if oip else ROUTE_NOT_FOUND)


# -- shared schemas -----------------------------------------------------------------------------

_OBJECT: dict[str, Any] = {"type": "object"}
_HEALTH = {"type": "object", "properties": {"status": {"type": "string"}}}
_READY = {"type": "object", "properties": {"ready": {"type": "boolean"}}}
_MODEL_READY = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "ready": {"type": "boolean"}},
}
OK: Mapping[str, Answer] = {"200": ("OK", _OBJECT)}
PREDICT_ERRORS = (400, 401, 404, 413, 422, 500, 503, 504)
_PREDICT_BODY = {
    "description": "Raw bytes, JSON or multipart form data; passed to the handler as is",
    "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
}
_INSTANCES = {"type": "object", "properties": {"instances": {"type": "array", "minItems": 1}}}
_PREDICTIONS = {"type": "object", "properties": {"predictions": {"type": "array"}}}
_JSON_BODY = {"content": {"application/json": {"schema": _OBJECT}}}
_GENERATE = {
    "type": "object",
    "properties": {
        "model_name": {"type": "string"},
        "model_version": {"type": "string"},
        "text_output": {"type": "string"},
    },
}
_GENERATE_BODY = {
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {"text_input": {"type": "string"}, "parameters": _OBJECT},
            }
        }
    }
}
_SUFFIX_TEXT = (
    "Further path segments reach the handler as the url_path header. The handler may set "
    "other statuses of its own."
)


def described(*, api_description: bool = False, strict: bool = False) -> tuple[Route, ...]:
    """``OPTIONS /`` and ``GET|OPTIONS /openapi.json`` (and TorchServe's /api-description)."""
    paths = ("/openapi.json", "/api-description") if api_description else ("/openapi.json",)
    summary = "This API description"
    return (
        Route("OPTIONS", "/", "describe", summary, answers=OK, strict=strict),
        *(
            Route(m, path, "describe", summary, answers=OK, strict=strict)
            for path in paths
            for m in ("GET", "OPTIONS")
        ),
    )


def _predictions(verb: str, methods: tuple[str, ...], endpoint: str) -> tuple[Route, ...]:
    base = f"/{verb.lower()}s/{{model_name}}"
    if verb == "Explanation":
        verb = "Explain"
    out = []
    for version, path in ((False, base), (True, base + "/{model_version}")):
        for method in methods:
            summary = f"{verb} with the {'given' if version else 'default'} version of a model"
            out.append(
                Route(method, path, endpoint, summary, (*PREDICT_ERRORS, 501),
                      {"200": ("The handler's output", "*/*")}, auth=True, body=_PREDICT_BODY,
                      description=_SUFFIX_TEXT, suffix=version, empty_segments=True)
            )  # fmt: skip
    return tuple(out)


_DURATION = {
    "type": "object",
    "properties": {"count": {"type": "integer"}, "ns": {"type": "integer"}},
}
_MODEL_STATS = {
    "type": "object",
    "properties": {
        "model_stats": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "version": {"type": "string"},
                    "last_inference": {"type": "integer"},
                    "inference_count": {"type": "integer"},
                    "execution_count": {"type": "integer"},
                    "inference_stats": {"type": "object", "additionalProperties": _DURATION},
                    "batch_stats": {"type": "array", "items": _OBJECT},
                },
            },
        }
    },
}
_INDEX = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {k: {"type": "string"} for k in ("name", "version", "state", "reason")},
    },
}
_INDEX_BODY = {
    "required": False,
    "content": {
        "application/json": {
            "schema": {"type": "object", "properties": {"ready": {"type": "boolean"}}}
        }
    },
}
_LOAD_BODY = {
    "required": False,
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {
                    "parameters": {
                        "type": "object",
                        "properties": {"config": {"type": "string"}},
                    }
                },
            }
        }
    },
}
_CONTROL_TEXT = (
    "Needs the management key (token authorization on) and the model API "
    "(enable_model_api; else 405)."
)


def _triton() -> tuple[Route, ...]:
    """Triton's statistics and model repository extensions (before ``/v2/models/{m}``, which
    would take ``stats`` for a model name)."""
    stats = {"200": ("Statistics", _MODEL_STATS)}
    return (
        Route("GET", "/v2/models/stats", "model_stats", "Statistics of every model version",
              (401,), stats, oip=True, auth=True, strict=True),
        Route("GET", "/v2/models/{model_name}/stats", "model_stats",
              "Statistics of every version of a model", (401, 404), stats, oip=True, auth=True,
              strict=True),
        Route("GET", "/v2/models/{model_name}/versions/{model_version}/stats", "model_stats",
              "Statistics of a model version", (401, 404), stats, oip=True, auth=True,
              strict=True),
        Route("POST", "/v2/repository/index", "repository_index",
              "The model store's models, loaded or not", (400, 401),
              {"200": ("Index", _INDEX)}, oip=True, auth=True, key="management",
              body=_INDEX_BODY, strict=True,
              description="Needs the management key (token authorization on)."),
        Route("POST", "/v2/repository/models/{model_name}/load", "repository_load",
              "Load a model from the model store", (400, 401, 404, 405, 409, 500, 503),
              OK, oip=True, auth=True, key="management", body=_LOAD_BODY, strict=True,
              description=_CONTROL_TEXT + " parameters.config may set max_batch_size, "
              "dynamic_batching.max_queue_delay_microseconds and instance_group[].count."),
        Route("POST", "/v2/repository/models/{model_name}/unload", "repository_unload",
              "Unload every version of a model", (400, 401, 404, 405, 503, 504), OK, oip=True,
              auth=True, key="management", body=_JSON_BODY, strict=True,
              description=_CONTROL_TEXT),
    )  # fmt: skip


def _v2_models() -> tuple[Route, ...]:
    out = list(_triton())
    for base in ("/v2/models/{model_name}", "/v2/models/{model_name}/versions/{model_version}"):
        out += [
            Route("GET", base, "model_metadata", "Model metadata", (401, 404), OK,
                  oip=True, auth=True, strict=True),
            Route("GET", base + "/ready", "model_ready", "Model readiness", (401, 404),
                  {"200": ("Ready", _MODEL_READY), "503": ("Not ready", _MODEL_READY)},
                  oip=True, auth=True, strict=True),
            Route("GET", base + "/config", "model_config",
                  "Model configuration (Triton's model configuration extension)", (401, 404),
                  OK, oip=True, auth=True, strict=True),
            Route("POST", base + "/infer", "v2_infer",
                  "Open Inference Protocol (KServe v2) inference", PREDICT_ERRORS,
                  {"200": ("Output tensors", _OBJECT)}, oip=True, auth=True, body=_JSON_BODY,
                  strict=True),
            Route("POST", base + "/generate", "generate",
                  "Generate extension: the handler's parts joined into one answer",
                  PREDICT_ERRORS, {"200": ("Generated text", _GENERATE)}, oip=True, auth=True,
                  body=_GENERATE_BODY, strict=True),
            Route("POST", base + "/generate_stream", "generate_stream",
                  "Generate extension: each part as a server-sent event", PREDICT_ERRORS,
                  {"200": ("Server-sent events, data: {generate response}", "text/event-stream")},
                  oip=True, auth=True, body=_GENERATE_BODY, strict=True),
        ]  # fmt: skip
    return tuple(out)


# The inference listener (TorchServe's inference API, KServe v1 and the Open Inference Protocol).
INFERENCE_ROUTES: tuple[Route, ...] = (
    *described(api_description=True),
    Route("GET", "/ping", "ping",
          "Health: 200 when every default model version has its minimum workers",
          answers={"200": ("Healthy", _HEALTH), "500": ("Unhealthy", _HEALTH)}),
    *_predictions("Prediction", ("POST", "PUT"), "predict"),
    *_predictions("Explanation", ("POST",), "explain"),
    Route("GET", "/v2", "server_metadata", "Server metadata", answers=OK, oip=True),
    Route("GET", "/v2/health/live", "live", "Liveness", answers=OK, oip=True),
    Route("GET", "/v2/health/ready", "ready", "Readiness: every model version has a ready worker",
          answers={"200": ("Ready", _READY), "503": ("Not ready", _READY)}, oip=True),
    *_v2_models(),
    Route("POST", "/v1/models/{model_name}:predict", "kserve_v1",
          "KServe v1 predict: one queued request per instance, answers in order",
          PREDICT_ERRORS, {"200": ("OK", _PREDICTIONS)}, auth=True,
          body={"content": {"application/json": {"schema": _INSTANCES}}},
          description="The first failed instance's status and body are the answer's."),
)  # fmt: skip

_NAMES = {
    "name": "name[]",
    "in": "query",
    "required": False,
    "schema": {"type": "array", "items": {"type": "string"}},
    "description": "Only these metric families",
}
_TEXT: Mapping[str, Answer] = {"200": ("OK", "text/plain")}

# The metrics listener: Prometheus text on /metrics (no key needed).
METRICS_ROUTES: tuple[Route, ...] = (
    *described(strict=True),
    Route("GET", "/metrics", "metrics", "Prometheus metrics (text exposition format)",
          answers=_TEXT, query=(_NAMES,), strict=True),
    Route("HEAD", "/metrics", "metrics", "The same, headers only", answers=_TEXT,
          query=(_NAMES,), strict=True),
)  # fmt: skip
