"""The inference listener's routes of Triton's extensions (statistics, model repository,
logging, trace), as ``routes.Route`` values for ``route_table.INFERENCE_ROUTES``. Torch-free."""

from __future__ import annotations

from torchbay.server.http.routes import JSON_BODY as _JSON_BODY
from torchbay.server.http.routes import OBJECT as _OBJECT
from torchbay.server.http.routes import OK, Route
from torchbay.server.http.routes import oip_route as _oip

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


def triton_routes() -> tuple[Route, ...]:
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
        *_logging(),
        *_trace(),
    )


_LOG_SETTINGS = {
    "type": "object",
    "properties": {
        "log_file": {"type": "string"},
        "log_info": {"type": "boolean"},
        "log_warning": {"type": "boolean"},
        "log_error": {"type": "boolean"},
        "log_verbose_level": {"type": "integer", "minimum": 0},
        "log_format": {"type": "string"},
    },
}


def _logging() -> tuple[Route, ...]:
    """Triton's logging extension: read and change the server's log settings."""
    return _settings_routes(
        "log_settings",
        (("/v2/logging", "server's log settings"),),
        _LOG_SETTINGS,
        "Needs the management key (token authorization on).",
        get_errors=(401,),
    )


def _settings_routes(
    endpoint: str,
    paths: tuple[tuple[str, str], ...],
    schema: dict[str, object],
    text: str,
    get_errors: tuple[int, ...] = (400, 401),
) -> tuple[Route, ...]:
    """``GET`` (read) and ``POST`` (change) of a settings object on each of ``paths`` (with
    what it holds, for the summary), with the management key."""
    settings = {"200": ("The settings in force", schema)}
    body = {"content": {"application/json": {"schema": schema}}}
    return tuple(
        Route(
            method,
            path,
            endpoint,
            summary + what,
            errors,
            settings,
            oip=True,
            auth=True,
            key="management",
            body=body if method == "POST" else None,
            strict=True,
            description=text,
        )
        for path, what in paths
        for method, summary, errors in (
            ("GET", "The ", get_errors),
            ("POST", "Change the ", (400, 401)),
        )
    )


_LIST = {"type": "array", "items": {"type": "string"}}
_TRACE_SETTINGS = {
    "type": "object",
    "properties": {
        "trace_level": _LIST,
        **{k: {"type": "string"} for k in ("trace_rate", "trace_count", "log_frequency")},
        "trace_file": {"type": "string"},
        "trace_mode": {"type": "string"},
    },
}


def _trace() -> tuple[Route, ...]:
    """Triton's trace extension: the global trace settings and a model's."""
    return _settings_routes(
        "trace_settings",
        (
            ("/v2/trace/setting", "global trace settings"),
            ("/v2/models/{model_name}/trace/setting", "trace settings of a model"),
        ),
        _TRACE_SETTINGS,
        "Needs the management key (token authorization on). Values are strings; null clears a "
        "setting (a model's falls back to the global one); trace_file is the server's setting.",
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
