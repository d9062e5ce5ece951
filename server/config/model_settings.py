"""Every model setting, declared once: the fields of ``ModelConfig``.

A setting's type, default and bounds are its field's; its TorchServe model-config.yaml (and
``models={...}``) key is the field's alias. What else it takes part in is the ``Setting`` in its
annotation (``Annotated[int, Setting(...)]``): its management API parameter, whether register
takes it and how it parses there, whether it changes live, whether a running version reads it,
and its describe-model key. Everything else is derived from ``SETTINGS``, never copied field by
field: the API names (``API_NAMES``), the bounds check of API values
(``check_model_settings``), the register and scale parameters (``plane.params``), the live
settings of a model version (``serving.launch.ModelSettings``) and describe's settings
(``plane.describe``). Adding a setting is one field here plus the code that uses it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from torchbay.server.config.queue_policy import (
    MAX_PRIORITY_LEVELS,
    QueuePolicyConfig,
    check_levels,
)
from torchbay.server.errors import BadRequest

# No NaN or infinity anywhere: ``max_batch_delay=inf`` is a typo, never a setting.
FROZEN = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, allow_inf_nan=False)

# Upper bounds for every numeric setting (config.properties, model-config.yaml, models={...},
# environment, flags and the management API all validate through ModelConfig and ServerConfig).
# They are far above any real deployment and far below what breaks the server
# (``min_worker=10**12`` used to raise MemoryError): a value past one is a mistake, answered with
# a clear 400 or start-up error.
MAX_WORKERS = 512  # per model version
MAX_BATCH_SIZE = 4096
MAX_QUEUE_SIZE = 1_000_000
MAX_DELAY_MS = 60_000.0  # a batch delay longer than a minute is a misconfiguration
MAX_TIMEOUT_S = 7 * 86_400.0  # a week, for every timeout
MAX_THREADS = 4096
MAX_DEVICE_ID = 1023
MAX_BODY_BYTES = (1 << 31) - 1  # the worker protocol's frame ceiling (protocol.MAX_FRAME)
MAX_CACHE_ENTRIES = 1_000_000  # per model version
MAX_CACHE_BYTES = 1 << 34  # 16 GiB per model version: the cache lives in the frontend's memory

# Where describe-model shows a setting: among TorchServe's batching and timeout keys (before the
# admission facts), beside the device keys, among torchbay's worker facts, or after TorchServe's
# "stateful" (its sequence keys).
Section = Literal["batching", "device", "workers", "sequences"]


@dataclass(frozen=True)
class Setting:
    """What one ``ModelConfig`` field takes part in beyond its type, default and bounds.

    ``register``: POST /models takes it, under ``api`` (True) or under its own name (a str).
    ``torchserve``: the parameter is TorchServe's, so register parses it as TorchServe does (junk
    or a value below the bound is the default); torchbay's own parameters are refused (400) when
    they are not numbers. ``live``: PUT /models changes it on a running version
    (``ModelVersion.configure``). ``serving``: the running version reads it, so it is a field of
    ``ModelSettings``. ``describe``: its describe-model key, shown in ``section``.
    The rest is filled in from the field by ``SETTINGS``.
    """

    api: str | None = None
    register: bool | str = False
    torchserve: bool = True
    live: bool = False
    serving: bool = False
    describe: str | None = None
    section: Section = "workers"
    # From the field:
    name: str = ""
    yaml_key: str | None = None
    annotation: Any = None
    default: Any = None
    lower: float | None = None  # the lowest value allowed: ge, or gt (with ``lower_open``)
    lower_open: bool = False

    @property
    def register_name(self) -> str | None:
        """The POST /models parameter, or None when register does not take this setting."""
        if isinstance(self.register, str):
            return self.register
        return self.api if self.register else None

    def bounded(self) -> bool:
        """Whether the field has numeric bounds (the bounds check covers it)."""
        return self.lower is not None


def _ts_live(api: str, describe: str | None = None) -> Setting:
    """A TorchServe parameter that register takes and the scale API tunes live."""
    return Setting(api, True, live=True, serving=True, describe=describe, section="batching")


def _own_live(api: str) -> Setting:
    """One of torchbay's own parameters (not in TorchServe), registered and tuned live."""
    return Setting(api, True, torchserve=False, live=True, serving=True)


def _serving(describe: str | None = None, section: Section = "workers") -> Setting:
    """Read by a running version, not an API parameter."""
    return Setting(serving=True, describe=describe, section=section)


class ResponseCacheConfig(BaseModel):
    """``responseCache: {enable, maxEntries, maxBytes}``: the response cache of one model version
    (``plane/cache.py``), off unless enabled. ``true`` / ``false`` is short for ``{enable: ...}``;
    the management API's ``response_cache`` parameter is either, or a JSON object."""

    model_config = FROZEN

    enable: bool = False
    max_entries: int = Field(1024, ge=1, le=MAX_CACHE_ENTRIES, alias="maxEntries")
    max_bytes: int = Field(64 << 20, ge=1, le=MAX_CACHE_BYTES, alias="maxBytes")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, str):  # a query string
            text = value.strip()
            if text.lower() in ("true", "false"):
                value = text.lower() == "true"
            else:
                try:
                    value = json.loads(text)
                except (ValueError, RecursionError):
                    raise ValueError("must be true, false or a JSON object") from None
        if isinstance(value, bool):
            return {"enable": value}
        return value


class ModelConfig(BaseModel):
    """Frontend settings of one model version. camelCase TorchServe names are accepted as aliases.

    ``max_workers`` defaults to ``min_workers``. ``handler_config`` holds model-config.yaml's
    other keys (TorchServe's backend parameters, ``context.model_yaml_config``). Within each
    describe section, the declaration order is describe-model's order.
    """

    model_config = FROZEN

    min_workers: Annotated[
        int,
        Setting(
            "min_worker", "initial_workers", serving=True, describe="minWorkers", section="batching"
        ),
    ] = Field(1, ge=0, le=MAX_WORKERS, alias="minWorkers")
    max_workers: Annotated[
        int | None, Setting("max_worker", serving=True, describe="maxWorkers", section="batching")
    ] = Field(None, ge=0, le=MAX_WORKERS, alias="maxWorkers")
    batch_size: Annotated[int, _ts_live("batch_size", "batchSize")] = Field(
        1, ge=1, le=MAX_BATCH_SIZE, alias="batchSize"
    )
    max_batch_delay_ms: Annotated[float, _ts_live("max_batch_delay", "maxBatchDelay")] = Field(
        100.0, ge=0, le=MAX_DELAY_MS, alias="maxBatchDelay"
    )
    response_timeout_s: Annotated[float, _ts_live("response_timeout", "responseTimeout")] = Field(
        120.0, gt=0, le=MAX_TIMEOUT_S, alias="responseTimeout"
    )
    # 0: no worker start succeeds, as in TorchServe (its management collection registers with
    # startup_timeout=0 and expects the 500).
    startup_timeout_s: Annotated[
        float,
        Setting(
            "startup_timeout", True, serving=True, describe="startupTimeout", section="batching"
        ),
    ] = Field(120.0, ge=0, le=MAX_TIMEOUT_S, alias="startupTimeout")
    max_retry_timeout_s: Annotated[float, _serving("maxRetryTimeoutInSec", "batching")] = Field(
        300.0, ge=0, le=MAX_TIMEOUT_S, alias="maxRetryTimeoutInSec"
    )
    client_timeout_ms: Annotated[float, _serving("clientTimeoutInMills", "batching")] = Field(
        0.0, ge=0, le=MAX_TIMEOUT_S * 1000, alias="clientTimeoutInMills"
    )  # 0 = none
    device_type: Annotated[
        Literal["cpu", "gpu", "auto"], Setting(describe="deviceType", section="device")
    ] = Field("auto", alias="deviceType")
    device_ids: Annotated[list[int] | None, Setting(describe="deviceIds", section="device")] = (
        Field(None, alias="deviceIds")
    )
    job_queue_size: Annotated[int, _serving()] = Field(
        100, ge=1, le=MAX_QUEUE_SIZE, alias="jobQueueSize"
    )
    # Admission: a request that cannot start within this many ms is answered 503 at once (0: off).
    # Describe shows it with the admission facts (ModelVersion.admission).
    max_queue_delay_ms: Annotated[float, _own_live("max_queue_delay_ms")] = Field(
        0.0, ge=0, le=MAX_DELAY_MS, alias="maxQueueDelayMs"
    )
    # SLA autopilot: adapt batch size and delay (up to the configured ones) to this p99 (0: off).
    # Describe shows it with the autopilot's state.
    sla_p99_ms: Annotated[float | None, _own_live("sla_p99_ms")] = Field(
        None, ge=0, le=MAX_DELAY_MS, alias="slaP99Ms"
    )
    cpu_threads: int | None = Field(None, ge=1, le=MAX_THREADS)  # None: a share of the budget
    cpu_affinity: bool = False
    default_version: bool = Field(False, alias="defaultVersion")
    mar_name: str | None = Field(None, alias="marName")
    # Overrides the manifest's handler (register only: it reaches the worker's Load).
    handler: Annotated[str | None, Setting("handler", True)] = None
    # Worker recycling (0 = off): restart a worker gracefully, without dropping a request, after
    # this many requests or once its resident memory passes this many MiB (a leaking handler).
    max_requests_per_worker: Annotated[int, _serving("maxRequestsPerWorker")] = Field(
        0, ge=0, le=10**12, alias="maxRequestsPerWorker"
    )
    max_worker_rss_mb: Annotated[int, _serving("maxWorkerRssMb")] = Field(
        0, ge=0, le=1 << 24, alias="maxWorkerRssMb"
    )
    # Many models per host (the server's ``max_loaded_models``, serving/multiplex.py): a pinned
    # version is never unloaded to make room for another (config only).
    pinned: Annotated[bool, _serving("pinned")] = Field(False, alias="pinned")
    # The response cache: repeated requests answered by the frontend (register and config only).
    response_cache: Annotated[
        ResponseCacheConfig,
        Setting("response_cache", True, torchserve=False, describe="responseCache"),
    ] = Field(default_factory=ResponseCacheConfig, alias="responseCache")
    # Sequences (stateful models, serving/sequences.py): TorchServe's sequence batching keys and
    # Triton's strategy. Off unless ``sequenceBatching``; every request then names a sequence
    # (or starts one) and runs on its sequence's worker, in order, one at a time.
    sequence_mode: Annotated[bool, _serving()] = Field(  # describe: TorchServe's "stateful"
        False, alias="sequenceBatching"
    )
    sequence_max_idle_ms: Annotated[int, _serving("sequenceMaxIdleMSec", "sequences")] = Field(
        0, ge=0, le=int(MAX_TIMEOUT_S * 1000), alias="sequenceMaxIdleMSec"
    )  # 0: the API's default (serving/sequence_ends.py)
    sequence_timeout_ms: Annotated[int, _serving("sequenceTimeoutMSec", "sequences")] = Field(
        0, ge=0, le=int(MAX_TIMEOUT_S * 1000), alias="sequenceTimeoutMSec"
    )  # 0: no total limit
    max_num_sequence: Annotated[int, _serving("maxNumSequence", "sequences")] = Field(
        1, ge=1, le=MAX_QUEUE_SIZE, alias="maxNumSequence"
    )  # raised to batchSize x maxWorkers, as TorchServe does
    max_sequence_job_queue_size: Annotated[
        int, _serving("maxSequenceJobQueueSize", "sequences")
    ] = Field(1, ge=1, le=MAX_QUEUE_SIZE, alias="maxSequenceJobQueueSize")
    # TorchServe's continuous batching (serving/continuous.py), for a sequence model: a request
    # whose handler says more is to come stays in its worker's next call, beside new requests.
    continuous_batching: Annotated[bool, _serving("continuousBatching", "sequences")] = Field(
        False, alias="continuousBatching"
    )
    sequence_strategy: Annotated[
        Literal["direct", "oldest"], _serving("sequenceStrategy", "sequences")
    ] = Field("oldest", alias="sequenceStrategy")
    # Priorities and queue policies (Triton's dynamic_batching; serving/priority.py, config only):
    # levels 1..priorityLevels, 1 highest (0: one level); a request's priority 0 is the default.
    priority_levels: int = Field(0, ge=0, le=MAX_PRIORITY_LEVELS, alias="priorityLevels")
    default_priority_level: int = Field(
        0, ge=0, le=MAX_PRIORITY_LEVELS, alias="defaultPriorityLevel"
    )
    default_queue_policy: QueuePolicyConfig | None = Field(None, alias="defaultQueuePolicy")
    priority_queue_policy: dict[int, QueuePolicyConfig] = Field(
        default_factory=dict, alias="priorityQueuePolicy"
    )
    handler_config: dict[str, Any] = Field(default_factory=dict)

    @field_validator("device_type", mode="before")
    @classmethod
    def _device_type(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip().lower()
            if value == "neuron":
                raise ValueError(
                    "deviceType 'neuron' (AWS Inferentia) is not supported; use cpu, gpu or auto"
                )
        return value

    @field_validator("device_ids", mode="before")
    @classmethod
    def _device_ids(cls, value: Any) -> Any:
        if isinstance(value, str):  # "0,1" from a query string or env
            value = [part for part in value.replace(" ", "").split(",") if part]
        if value is not None and not isinstance(value, list | tuple):
            raise ValueError(f"deviceIds must be a list of GPU ids, such as [0, 1]; got {value!r}")
        return value or None

    @field_validator("device_ids")
    @classmethod
    def _device_ids_nonnegative(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(not 0 <= i <= MAX_DEVICE_ID for i in value):
            raise ValueError(f"device ids must be 0 to {MAX_DEVICE_ID}, got {value}")
        return value

    @model_validator(mode="after")
    def _priorities(self) -> ModelConfig:
        check_levels(self.priority_levels, self.default_priority_level, self.priority_queue_policy)
        queued = self.priority_levels or self.default_queue_policy or self.priority_queue_policy
        if self.sequence_mode and queued:
            # Triton's model config has one or the other (a oneof); ours ignored the levels.
            raise ValueError(
                "priorityLevels, defaultQueuePolicy and priorityQueuePolicy are dynamic "
                "batching's: a sequence model (sequenceBatching) has none"
            )
        return self

    @model_validator(mode="after")
    def _workers(self) -> ModelConfig:
        if self.max_workers is None:
            # Frozen model: set the derived default without marking it as user-set, so
            # model_dump(exclude_unset=True) still tells layers what was given.
            object.__setattr__(self, "max_workers", self.min_workers)
        elif self.max_workers < self.min_workers:
            raise ValueError(
                f"max_workers ({self.max_workers}) must be >= min_workers ({self.min_workers})"
            )
        return self


def declared(model: type[BaseModel]) -> dict[str, Setting]:
    """Each field's Setting (a plain one where the field has none), filled in from the field;
    ``model`` is ModelConfig (or, in tests, a model with one more setting)."""
    defaults = model()  # validated: ModelConfig's max_workers is min_workers
    out: dict[str, Setting] = {}
    for name, info in model.model_fields.items():
        setting = next((m for m in info.metadata if isinstance(m, Setting)), Setting())
        ge = next((m.ge for m in info.metadata if getattr(m, "ge", None) is not None), None)
        gt = next((m.gt for m in info.metadata if getattr(m, "gt", None) is not None), None)
        out[name] = replace(
            setting,
            name=name,
            yaml_key=info.alias,
            annotation=info.annotation,
            default=getattr(defaults, name),
            lower=ge if ge is not None else gt,
            lower_open=gt is not None,
        )
    return out


def api_names(settings: Mapping[str, Setting]) -> dict[str, str]:
    """Management API parameter (scale's and register's names) -> field."""
    return {
        name: s.name
        for s in settings.values()
        for name in dict.fromkeys((s.api, s.register_name))
        if name is not None
    }


# Field name -> its declaration, in ModelConfig's order.
SETTINGS: dict[str, Setting] = declared(ModelConfig)
API_NAMES = api_names(SETTINGS)
# Those whose values have bounds to check (every numeric one).
_BOUNDED = {api: field for api, field in API_NAMES.items() if SETTINGS[field].bounded()}


def check_model_settings(params: Mapping[str, Any]) -> None:
    """Raise BadRequest unless each given API parameter is within ``ModelConfig``'s bounds.

    ``params`` maps management API parameter names to values (None = not given); names that are
    not bounded settings are skipped. ModelConfig is the one definition of the limits
    (config.properties, model-config.yaml, the management API and Triton's repository load share
    it).
    """
    given = {k: v for k, v in params.items() if v is not None and k in _BOUNDED}
    if not given:
        return
    try:
        ModelConfig.model_validate({_BOUNDED[k]: v for k, v in given.items()})
    except ValidationError as exc:
        names = {_BOUNDED[k]: k for k in given}
        parts = []
        for err in exc.errors():
            loc = [names.get(str(p), str(p)) for p in err.get("loc", ())]
            parts.append(
                f"{'.'.join(loc) or 'request'}: {err.get('msg')} (got {err.get('input')!r})"
            )
        raise BadRequest("Invalid parameter(s): " + "; ".join(parts)) from None
