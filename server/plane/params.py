"""The management API's parameters as TorchServe 0.12 parses them (register, scale), for every
protocol: HTTP hands in the query strings, gRPC the message's numbers.

The model settings among them are the ones declared in ``config.model_settings``: register
takes each setting with a register name, parsed TorchServe's lenient way (junk, or a value below
the setting's bound, is the default) or, for torchbay's own parameters, strictly (not a number is
a 400); scale tunes each ``live`` setting, strictly (TorchServe's scale API has none of them).
Values past a bound are left for ``check_model_settings`` (400).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, create_model

from torchbay.server.config.model_settings import (
    MAX_TIMEOUT_S,
    SETTINGS,
    Setting,
    check_model_settings,
)
from torchbay.server.config.sources import api_bool, api_int, api_number
from torchbay.server.errors import BadRequest

RUNTIMES = ("python", "python3")  # TorchServe's Manifest.RuntimeType that torchbay runs
# The settings register takes, and those the scale API tunes live: by parameter name.
REGISTERED = {s.register_name: s for s in SETTINGS.values() if s.register_name is not None}
LIVE = {s.api: s for s in SETTINGS.values() if s.live and s.api is not None}


class _Invalid(Protocol):
    """A pydantic ``ValidationError``, or FastAPI's ``RequestValidationError``."""

    def errors(self) -> Sequence[Any]: ...


def validation_message(exc: _Invalid) -> str:
    """A pydantic error as the 400's message: each bad parameter with what is wrong."""
    parts = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p not in ("query", "body", "path")]
        parts.append(f"{'.'.join(loc) or 'request'}: {err.get('msg')}")
    return "Invalid parameter(s): " + "; ".join(parts)


def _number_parser(setting: Setting) -> Callable[[Any], Any] | None:
    """How a query string becomes the setting's number (None: the setting is not a number)."""
    if setting.annotation in (int, int | None):
        return api_int
    if setting.annotation in (float, float | None):
        return api_number
    return None


def strict_number(name: str, value: Any, parse: Callable[[Any], Any]) -> Any:
    """``parse(value)``, None when absent, or BadRequest when it is not a finite number."""
    if value is None:
        return None
    number = parse(value)
    if number is None:
        raise BadRequest(f"Invalid parameter(s): {name}: must be a finite number, got {value!r}")
    return number


def _lenient(setting: Setting, value: Any) -> Any:
    """TorchServe's parsing: a junk number, or one below the bound, is None (the default)."""
    parse = _number_parser(setting)
    if parse is None:
        return value
    number = parse(value)
    if number is None or setting.lower is None:
        return number
    below = number <= setting.lower if setting.lower_open else number < setting.lower
    return None if below else number


def _register_field(setting: Setting) -> tuple[Any, Any]:
    """A RegisterParams field: the setting's type or None, with the setting's lower bound."""
    bound = {} if setting.lower is None else {"gt" if setting.lower_open else "ge": setting.lower}
    return (setting.annotation | None, Field(None, **bound))


class _Request(BaseModel):
    """What POST /models takes besides the model settings."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    url: str
    # Checked as the archiver's (store.check_name_and_version: it names a folder), with its words.
    model_name: str | None = Field(None, min_length=1)
    runtime: str | None = None
    synchronous: bool = True  # TorchServe's code default (its docs say false)
    s3_sse_kms: bool | None = None  # accepted and ignored (no S3 here)


def register_model(registered: Mapping[str, Setting]) -> type[_Request]:
    """``RegisterParams``: the ``POST /models`` parameters once parsed (``register_params``),
    the request's own and then one field per registered setting, by its register name (None:
    not given)."""
    fields = {name: _register_field(s) for name, s in registered.items()}
    return create_model("RegisterParams", __base__=_Request, **fields)


RegisterParams = register_model(REGISTERED)


def register_params(raw: Mapping[str, Any]) -> Any:
    """TorchServe's RegisterModelRequest: ``url`` required (an empty one is the registry's 404),
    an unknown ``runtime`` is a 400, numbers that are junk or below their setting's bound (zero
    too for batch size and timeouts) are the default (a negative ``max_batch_delay`` too:
    TorchServe keeps -1). torchbay's own parameters (``max_queue_delay_ms``, ``sla_p99_ms``; not
    in TorchServe) are refused when they are not numbers, as the scale API refuses them."""
    url = raw.get("url")
    if url is None:
        raise BadRequest("Parameter url is required.")
    check_runtime(raw.get("runtime"))
    settings = {}
    for name, setting in REGISTERED.items():
        parse = _number_parser(setting)
        if parse is not None and not setting.torchserve:
            settings[name] = strict_number(name, raw.get(name), parse)
        elif name in raw:
            settings[name] = _lenient(setting, raw[name])
    return RegisterParams.model_validate(
        {
            **raw,
            "model_name": raw.get("model_name") or None,
            "synchronous": api_bool(raw.get("synchronous"), True),
            "s3_sse_kms": api_bool(raw.get("s3_sse_kms"), False),
            **settings,
        }
    )


def check_json_numbers(body: Mapping[str, Any]) -> None:
    """A JSON body's whole-number parameters (``batch_size``, ``initial_workers``): TorchServe
    reads the body into int fields (Gson), so ``4``, ``4.0`` and ``"4"`` are 4 and anything
    else refuses the request (its 500 JsonSyntaxException); torchbay's 400 names it. The query
    string stays lenient (junk: the default), as TorchServe's."""
    for name, setting in REGISTERED.items():
        value = body.get(name)
        if value is not None and _number_parser(setting) is api_int and api_int(value) is None:
            raise BadRequest(
                f"Invalid parameter(s): {name}: must be a whole number, got {str(value)[:64]!r}"
            )


def check_runtime(runtime: Any) -> None:
    """TorchServe's ``runtime`` parameter: none, or one of its RuntimeType values (a 400)."""
    if runtime is not None and runtime not in RUNTIMES:
        raise BadRequest(f"Invalid RuntimeType value: {str(runtime)[:64]}")


def register_overrides(params: Any) -> dict[str, Any]:
    """The settings a registration gives, by API name (``registry.register``'s overrides); the
    worker count is not among them (``initial_workers`` is its own argument)."""
    return {
        name: value
        for name, setting in REGISTERED.items()
        if setting.name != "min_workers" and (value := getattr(params, name)) is not None
    }


@dataclass(frozen=True)
class ScaleParams:
    """``PUT /models/{m}[/{v}]`` parameters once parsed and checked (``scale_params``)."""

    min_worker: int | None = None
    max_worker: int | None = None
    synchronous: bool = False
    timeout: float = -1  # TorchServe's drain timeout; torchbay always drains the batch in hand
    tuning: dict[str, Any] = field(default_factory=dict)  # live settings by field name

    def tuned(self) -> bool:
        return any(value is not None for value in self.tuning.values())


def scale_params(raw: Mapping[str, Any]) -> ScaleParams:
    """TorchServe's own parameters parse leniently (junk is the default: ``min_worker`` 1 when
    nothing is tuned, ``timeout`` -1, as is one below -1); the live settings (not in
    TorchServe's scale API) are refused when they are not numbers. The defaults filled in and
    every value checked, or BadRequest; nothing has changed yet."""
    tuning = {
        name: strict_number(name, raw.get(name), _number_parser(s) or api_number)
        for name, s in LIVE.items()
    }
    min_worker, max_worker = api_int(raw.get("min_worker")), api_int(raw.get("max_worker"))
    drain = api_number(raw.get("timeout"))
    # TorchServe takes any timeout below -1 (as -1: no bound); one past the bound is a typo.
    timeout = -1 if drain is None or drain < -1 else drain
    if timeout > MAX_TIMEOUT_S:
        raise BadRequest(f"timeout must be -1 to {MAX_TIMEOUT_S:g} seconds, got {timeout}")
    if min_worker is None and all(v is None for v in tuning.values()):
        min_worker = 1  # TorchServe's default
    if min_worker is not None and max_worker is None:
        max_worker = max(min_worker, 0)
    if min_worker is None and max_worker is not None:
        raise BadRequest("max_worker needs min_worker")
    if max_worker is not None and min_worker is not None and max_worker < min_worker:
        raise BadRequest("max_worker cannot be less than min_worker.")  # TorchServe's words
    check_model_settings({"min_worker": min_worker, "max_worker": max_worker, **tuning})
    return ScaleParams(
        min_worker=min_worker,
        max_worker=max_worker,
        synchronous=api_bool(raw.get("synchronous"), False),
        timeout=timeout,
        tuning={LIVE[name].name: value for name, value in tuning.items()},
    )
