"""The raw ASGI listeners' route tables (inference, metrics): every route once, as
``routes.Route`` values; ``InferenceApp`` dispatches them (``routes.Router``) and
``server.http.openapi`` renders them as the OpenAPI documents. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchbay.server.http.routes import Answer, Route

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
                Route(
                    method,
                    path,
                    endpoint,
                    summary,
                    (*PREDICT_ERRORS, 501),
                    {"200": ("The handler's output", "*/*")},
                    auth=True,
                    body=_PREDICT_BODY,
                    description=_SUFFIX_TEXT,
                    suffix=version,
                    empty_segments=True,
                )
            )
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


def _oip(
    method: str,
    path: str,
    endpoint: str,
    summary: str,
    errors: tuple[int, ...],
    answers: Mapping[str, Answer],
    body: dict[str, Any] | None = None,
) -> Route:
    """An Open Inference Protocol route: OIP errors, the inference key, 405 on other methods."""
    return Route(
        method,
        path,
        endpoint,
        summary,
        errors,
        answers,
        oip=True,
        auth=True,
        body=body,
        strict=True,
    )


def _triton() -> tuple[Route, ...]:
    """Triton's statistics and model repository extensions (before ``/v2/models/{m}``, which
    would take ``stats`` for a model name)."""
    stats = {"200": ("Statistics", _MODEL_STATS)}
    model, version = "/v2/models/{model_name}", "/versions/{model_version}"
    return (
        _oip(
            "GET",
            "/v2/models/stats",
            "model_stats",
            "Statistics of every model version",
            (401,),
            stats,
        ),
        _oip(
            "GET",
            model + "/stats",
            "model_stats",
            "Statistics of every version of a model",
            (401, 404),
            stats,
        ),
        _oip(
            "GET",
            model + version + "/stats",
            "model_stats",
            "Statistics of a model version",
            (401, 404),
            stats,
        ),
        *_repository(),
    )


def _repository() -> tuple[Route, ...]:
    """Triton's model repository extension: index, load and unload."""
    return (
        Route(
            "POST",
            "/v2/repository/index",
            "repository_index",
            "The model store's models, loaded or not",
            (400, 401),
            {"200": ("Index", _INDEX)},
            oip=True,
            auth=True,
            key="management",
            body=_INDEX_BODY,
            strict=True,
            description="Needs the management key (token authorization on).",
        ),
        Route(
            "POST",
            "/v2/repository/models/{model_name}/load",
            "repository_load",
            "Load a model from the model store",
            (400, 401, 404, 405, 409, 500, 503),
            OK,
            oip=True,
            auth=True,
            key="management",
            body=_LOAD_BODY,
            strict=True,
            description=_CONTROL_TEXT + " parameters.config may set max_batch_size, "
            "dynamic_batching.max_queue_delay_microseconds and instance_group[].count.",
        ),
        Route(
            "POST",
            "/v2/repository/models/{model_name}/unload",
            "repository_unload",
            "Unload every version of a model",
            (400, 401, 404, 405, 503, 504),
            OK,
            oip=True,
            auth=True,
            key="management",
            body=_JSON_BODY,
            strict=True,
            description=_CONTROL_TEXT,
        ),
    )


def _v2_model_routes(base: str) -> list[Route]:
    """The routes of one model URL form (``/v2/models/{m}`` or ``.../versions/{v}``)."""
    ready = {"200": ("Ready", _MODEL_READY), "503": ("Not ready", _MODEL_READY)}
    events = {"200": ("Server-sent events, data: {generate response}", "text/event-stream")}
    config = "Model configuration (Triton's model configuration extension)"
    return [
        _oip("GET", base, "model_metadata", "Model metadata", (401, 404), OK),
        _oip("GET", base + "/ready", "model_ready", "Model readiness", (401, 404), ready),
        _oip("GET", base + "/config", "model_config", config, (401, 404), OK),
        _oip(
            "POST",
            base + "/infer",
            "v2_infer",
            "Open Inference Protocol (KServe v2) inference",
            PREDICT_ERRORS,
            {"200": ("Output tensors", _OBJECT)},
            _JSON_BODY,
        ),
        _oip(
            "POST",
            base + "/generate",
            "generate",
            "Generate extension: the handler's parts joined into one answer",
            PREDICT_ERRORS,
            {"200": ("Generated text", _GENERATE)},
            _GENERATE_BODY,
        ),
        _oip(
            "POST",
            base + "/generate_stream",
            "generate_stream",
            "Generate extension: each part as a server-sent event",
            PREDICT_ERRORS,
            events,
            _GENERATE_BODY,
        ),
    ]


def _v2_models() -> tuple[Route, ...]:
    out = list(_triton())
    for base in ("/v2/models/{model_name}", "/v2/models/{model_name}/versions/{model_version}"):
        out += _v2_model_routes(base)
    return tuple(out)


# The inference listener (TorchServe's inference API, KServe v1 and the Open Inference Protocol).
INFERENCE_ROUTES: tuple[Route, ...] = (
    *described(api_description=True),
    Route(
        "GET",
        "/ping",
        "ping",
        "Health: 200 when every default model version has its minimum workers",
        answers={"200": ("Healthy", _HEALTH), "500": ("Unhealthy", _HEALTH)},
    ),
    *_predictions("Prediction", ("POST", "PUT"), "predict"),
    *_predictions("Explanation", ("POST",), "explain"),
    Route("GET", "/v2", "server_metadata", "Server metadata", answers=OK, oip=True),
    Route("GET", "/v2/health/live", "live", "Liveness", answers=OK, oip=True),
    Route(
        "GET",
        "/v2/health/ready",
        "ready",
        "Readiness: every model version has a ready worker",
        answers={"200": ("Ready", _READY), "503": ("Not ready", _READY)},
        oip=True,
    ),
    *_v2_models(),
    Route(
        "POST",
        "/v1/models/{model_name}:predict",
        "kserve_v1",
        "KServe v1 predict: one queued request per instance, answers in order",
        PREDICT_ERRORS,
        {"200": ("OK", _PREDICTIONS)},
        auth=True,
        body={"content": {"application/json": {"schema": _INSTANCES}}},
        description="The first failed instance's status and body are the answer's.",
    ),
)

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
    Route(
        "GET",
        "/metrics",
        "metrics",
        "Prometheus metrics (text exposition format)",
        answers=_TEXT,
        query=(_NAMES,),
        strict=True,
    ),
    Route(
        "HEAD",
        "/metrics",
        "metrics",
        "The same, headers only",
        answers=_TEXT,
        query=(_NAMES,),
        strict=True,
    ),
)
