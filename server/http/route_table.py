"""The raw ASGI listeners' route tables (inference, metrics): every route once, as
``routes.Route`` values; ``InferenceApp`` dispatches them (``routes.Router``) and
``server.http.openapi`` renders them as the OpenAPI documents. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchbay.server.http.routes import JSON_BODY as _JSON_BODY
from torchbay.server.http.routes import OBJECT as _OBJECT
from torchbay.server.http.routes import OK, Answer, Route
from torchbay.server.http.routes import oip_route as _oip
from torchbay.server.http.shm_routes import shm_routes
from torchbay.server.http.triton_routes import triton_routes
from torchbay.server.http.wfpredict import WFPREDICT_ROUTES

# -- shared schemas -----------------------------------------------------------------------------

_HEALTH = {"type": "object", "properties": {"status": {"type": "string"}}}
_READY = {"type": "object", "properties": {"ready": {"type": "boolean"}}}
_MODEL_READY = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "ready": {"type": "boolean"}},
}
PREDICT_ERRORS = (400, 401, 404, 413, 422, 500, 503, 504)
_PREDICT_BODY = {
    "description": "Raw bytes, JSON or multipart form data; passed to the handler as is",
    "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
}
_NAMES_LIST = {"type": "array", "items": {"type": "string"}}
_MODELS = {"type": "object", "properties": {"models": _NAMES_LIST}}
_LIST = "KServe: the names of the models served"
_INSTANCES = {"type": "object", "properties": {"instances": {"type": "array", "minItems": 1}}}
_PREDICTIONS = {"type": "object", "properties": {"predictions": {"type": "array"}}}
_EXPLANATIONS = {"type": "object", "properties": {"explanations": {"type": "array"}}}
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
_ANY_METHOD_TEXT = (
    " Any other method (DELETE, PATCH, HEAD: no body in the answer) runs the model too, as "
    "TorchServe 0.12 checks no method; OPTIONS answers the model's API description."
)
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
                    description=_SUFFIX_TEXT + _ANY_METHOD_TEXT,
                    suffix=version,
                    empty_segments=True,
                    any_method=method == "POST",  # TorchServe 0.12 runs the model on any method
                )
            )
        summary = "The model's API description (TorchServe's OPTIONS on a model)"
        answers = {"200": ("OpenAPI document of the model's operations", _OBJECT)}
        out.append(Route("OPTIONS", path, "model_api", summary, (401, 404), answers, auth=True))
    return tuple(out)


def _legacy_predict() -> tuple[Route, ...]:
    """TorchServe's legacy (MMS) ``/{model}[/{version}]/predict``, answered as ``/predictions``
    (a model named as one of the routes' own first segments, ``ping`` or ``v2``, cannot)."""
    paths = ("/{model_name}/predict", "/{model_name}/{model_version}/predict")
    return tuple(
        Route(
            method,
            path,
            "predict",
            "Predict (TorchServe's legacy form of /predictions)",
            (*PREDICT_ERRORS, 501),
            {"200": ("The handler's output", "*/*")},
            auth=True,
            body=_PREDICT_BODY,
        )
        for path in paths
        for method in ("POST", "PUT")
    )


def _sagemaker() -> tuple[Route, ...]:
    """SageMaker's serving contract, as TorchServe 0.12 serves it (docs/sagemaker.md)."""
    name = {
        "name": "model_name",
        "in": "query",
        "required": False,
        "schema": {"type": "string"},
        "description": "The model (also a model_name header); without it, the only model "
        "loaded at start-up",
    }
    common: dict[str, Any] = {
        "errors": PREDICT_ERRORS,
        "answers": {"200": ("The handler's output", "*/*")},
        "auth": True,
        "body": _PREDICT_BODY,
        "slash": True,  # TorchServe 0.12 answers /invocations/ and /models/m/invoke/ too
        "any_method": True,  # and runs the model on any method (GET: an empty body)
    }
    return (
        Route("POST", "/invocations", "invocations", "SageMaker: predict", query=(name,), **common),
        Route(
            "POST",
            "/models/{model_name}/invoke",
            "invoke",
            "SageMaker: predict with the default version of a model",
            **common,
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
            (*PREDICT_ERRORS, 501),
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
    # KServe's model server lists its models here too (the kserve_v1 endpoint's answer).
    listed = _oip("GET", "/v2/models", "kserve_models", _LIST, (401,), {"200": ("OK", _MODELS)})
    out = [listed, *triton_routes(), *shm_routes()]
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
        description="Every method is answered so (HEAD: without the body), as TorchServe 0.12.",
        slash=True,  # /ping/, as TorchServe
        any_method=True,
    ),
    # PUT (curl -T, as TorchServe's docs send images) and GET (a query alone): TorchServe 0.12
    # answers both (its workflow record's predict_node_model_put / _get)
    *_predictions("Prediction", ("POST", "PUT", "GET"), "predict"),
    *_predictions("Explanation", ("POST", "PUT", "GET"), "explain"),
    *_sagemaker(),
    # Another method on these: 405 with Allow (Triton and KServe answer 405, HEAD included)
    Route("GET", "/v2", "server_metadata", "Server metadata", answers=OK, oip=True, strict=True),
    Route("GET", "/v2/health/live", "live", "Liveness", answers=OK, oip=True, strict=True),
    Route(
        "GET",
        "/v2/health/ready",
        "ready",
        "Readiness: every model version has a ready worker",
        answers={"200": ("Ready", _READY), "503": ("Not ready", _READY)},
        oip=True,
        strict=True,
    ),
    *_v2_models(),
    Route("GET", "/", "kserve_live", "KServe v1 liveness", answers={"200": ("Live", _HEALTH)}),
    Route(
        "GET",
        "/v1/models",
        "kserve_models",
        _LIST,
        (401,),
        {"200": ("OK", _MODELS)},
        auth=True,
        strict=True,
    ),
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
        strict=True,  # GET on it: 405, as KServe (not this model's readiness)
    ),
    Route(
        "POST",
        "/v1/models/{model_name}:explain",
        "kserve_v1_explain",
        "KServe v1 explain: each instance through the handler's explain path (Captum)",
        (*PREDICT_ERRORS, 501),
        {"200": ("OK", _EXPLANATIONS)},
        auth=True,
        body={"content": {"application/json": {"schema": _INSTANCES}}},
        description="As /explanations; 501 when the handler has no explanations.",
        strict=True,
    ),
    Route(
        "GET",
        "/v1/models/{model_name}",
        "kserve_ready",
        "KServe v1 model readiness (the management API's, where both share the listener)",
        (401, 404),
        {"200": ("Ready", _MODEL_READY), "503": ("Not ready", _MODEL_READY)},
        auth=True,
        strict=True,
    ),
    *WFPREDICT_ROUTES,  # TorchServe's workflows (http/wfpredict.py)
    *_legacy_predict(),
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
        slash=True,  # /metrics/, and any method, as TorchServe 0.12 answers them
        any_method=True,
    ),
    Route(
        "HEAD",
        "/metrics",
        "metrics",
        "The same, headers only",
        answers=_TEXT,
        query=(_NAMES,),
        strict=True,
        slash=True,
    ),
)
