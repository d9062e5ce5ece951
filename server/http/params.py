"""The management API's parameters as TorchServe 0.12 parses them (register, scale), and the
bounds check every model setting from the API goes through (``ModelConfig``'s own bounds)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from torchbay.server.config.settings import API_NAMES, ModelConfig
from torchbay.server.config.sources import api_bool, api_int, api_number, positive_or_none
from torchbay.server.errors import BadRequest

RUNTIMES = ("python", "python3")  # TorchServe's Manifest.RuntimeType that torchbay runs


TORCHBAY_TUNING = ("max_queue_delay_ms", "sla_p99_ms")  # API parameters TorchServe has not


def strict_number(name: str, value: Any, parse: Callable[[Any], Any]) -> Any:
    """``parse(value)``, None when absent, or BadRequest when it is not a finite number."""
    if value is None:
        return None
    number = parse(value)
    if number is None:
        raise BadRequest(f"Invalid parameter(s): {name}: must be a finite number, got {value!r}")
    return number


class RegisterParams(BaseModel):
    """``POST /models`` parameters (TorchServe's names) once parsed as TorchServe parses them
    (``register_params``): a junk or non-positive number is None, the default."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    url: str
    model_name: str | None = Field(None, min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    handler: str | None = None
    runtime: str | None = None
    batch_size: int | None = Field(None, ge=1)
    max_batch_delay: float | None = Field(None, ge=0)
    initial_workers: int | None = Field(None, ge=0)
    synchronous: bool = True  # TorchServe's code default (its docs say false)
    response_timeout: float | None = Field(None, gt=0)
    startup_timeout: float | None = Field(None, gt=0)
    s3_sse_kms: bool | None = None  # accepted and ignored (no S3 here)
    max_queue_delay_ms: float | None = Field(None, ge=0)  # torchbay's: the queue-time bound
    sla_p99_ms: float | None = Field(None, ge=0)  # torchbay's: the autopilot's target (0: off)


def register_params(raw: dict[str, Any]) -> RegisterParams:
    """TorchServe's RegisterModelRequest: ``url`` required (an empty one is the registry's 404),
    an unknown ``runtime`` is a 400, numbers that are junk, or negative (zero too for batch
    size and timeouts), are the default (a negative ``max_batch_delay`` too: TorchServe keeps
    -1). Numbers past ``ModelConfig``'s bounds are left for ``check_model_settings`` (400).
    torchbay's own parameters (``max_queue_delay_ms``, ``sla_p99_ms``; not in TorchServe) are
    refused when they are not numbers, as the scale API refuses them."""
    url = raw.get("url")
    if url is None:
        raise BadRequest("Parameter url is required.")
    runtime = raw.get("runtime")
    if runtime is not None and runtime not in RUNTIMES:
        raise BadRequest(f"Invalid RuntimeType value: {str(runtime)[:64]}")
    initial = api_int(raw.get("initial_workers"))
    delay = api_number(raw.get("max_batch_delay"))
    batch_size = api_int(raw.get("batch_size"))
    return RegisterParams.model_validate(
        {
            **raw,
            "model_name": raw.get("model_name") or None,
            "batch_size": batch_size if batch_size is not None and batch_size > 0 else None,
            "max_batch_delay": delay if delay is not None and delay >= 0 else None,
            "initial_workers": initial if initial is not None and initial >= 0 else None,
            "synchronous": api_bool(raw.get("synchronous"), True),
            "response_timeout": positive_or_none(api_number(raw.get("response_timeout"))),
            "startup_timeout": positive_or_none(api_number(raw.get("startup_timeout"))),
            "s3_sse_kms": api_bool(raw.get("s3_sse_kms"), False),
            **{name: strict_number(name, raw.get(name), api_number) for name in TORCHBAY_TUNING},
        }
    )


class ScaleParams(BaseModel):
    """``PUT /models/{m}[/{v}]`` parameters."""

    model_config = ConfigDict(frozen=True, allow_inf_nan=False)

    min_worker: int | None = Field(None, ge=0)
    max_worker: int | None = Field(None, ge=0)
    synchronous: bool = False
    timeout: float = -1  # TorchServe's drain timeout; torchbay always drains the batch in hand
    batch_size: int | None = Field(None, ge=1)
    max_batch_delay: float | None = Field(None, ge=0)
    response_timeout: float | None = Field(None, gt=0)
    max_queue_delay_ms: float | None = Field(None, ge=0)  # the queue-time bound (0: off)
    sla_p99_ms: float | None = Field(None, ge=0)  # the autopilot's target (0: off)


# API parameter -> ModelConfig field, for the bounds check (register's initial_workers too).
_BOUNDED = {
    **{k: v for k, v in API_NAMES.items() if k != "handler"},
    "initial_workers": "min_workers",
}


def check_model_settings(params: dict[str, Any]) -> None:
    """Raise BadRequest unless each given API parameter is within ``ModelConfig``'s bounds.

    ``params`` maps TorchServe parameter names to values (None = not given). ModelConfig is the
    one definition of the limits (config.properties, model-config.yaml and this API share it).
    """
    fields = {_BOUNDED[k]: v for k, v in params.items() if v is not None and k in _BOUNDED}
    if not fields:
        return
    try:
        ModelConfig.model_validate(fields)
    except ValidationError as exc:
        names = {_BOUNDED[k]: k for k, v in params.items() if v is not None and k in _BOUNDED}
        parts = []
        for err in exc.errors():
            loc = [names.get(str(p), str(p)) for p in err.get("loc", ())]
            parts.append(
                f"{'.'.join(loc) or 'request'}: {err.get('msg')} (got {err.get('input')!r})"
            )
        raise BadRequest("Invalid parameter(s): " + "; ".join(parts)) from None
