"""Server and model configuration: two frozen pydantic models, ``ServerConfig`` here and
``ModelConfig`` in ``config.model_settings`` (the sources and their layering are in
``config.sources``).

Server sources, later wins (``load_server_config``)::

    defaults < config.properties < TS_<KEY> env (only with enable_envvars_config=true)
             < TORCHBAY_<KEY> env < command-line flags the user set

TorchServe ranks env above the CLI; torchbay ranks the CLI last (DESIGN.md), because a flag typed
now is the most deliberate source. Model settings, later wins (``resolve_model_config``)::

    ServerConfig defaults < models={...} entry < archive's model-config.yaml < management API

(a restored ``model_snapshot``'s entry ranks over the archive's YAML: config.model_layers).

TorchServe keys torchbay has no use for (``vmargs``, netty, gRPC, ``parallelType``, ...) are never
fatal: they come back as notes for the caller to log, as do unknown keys (users bring whole
TorchServe configs). Bad values of keys torchbay uses raise pydantic's ``ValidationError`` (but
from config.properties, most warn and keep their default: ``config.lenient``); an
unreadable config file raises ``ConfigError``. Torch-free; nothing here reads ``os.environ``.

Deliberate default differences from TorchServe:

* ``default_workers_per_model=1`` (TorchServe: #GPUs or #CPUs, which spawned one worker per core
  and crashed laptops, pytorch/serve#2432).
* ``allowed_urls=[]``: only archives in the model store can be registered (TorchServe allows every
  http(s) and file URL by default, pytorch/serve#2531).
* ``metrics_mode=prometheus`` (TorchServe: ``log``): TorchServe's metrics on /metrics, not only
  in ``ts_metrics.log``; ``log`` and ``legacy`` write the log files as TorchServe does.
* ``deviceType: neuron`` (AWS Inferentia) is rejected with a clear error rather than run on CPU.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from torchbay.server.config import gson_json
from torchbay.server.config.grpc_settings import GrpcSettings
from torchbay.server.config.model_keys import MODEL_ALIASES, MODEL_IGNORED_KEYS, split_model_keys
from torchbay.server.config.model_settings import (
    API_NAMES,
    FROZEN,
    MAX_BATCH_SIZE,
    MAX_BODY_BYTES,
    MAX_DELAY_MS,
    MAX_DEVICE_ID,
    MAX_QUEUE_SIZE,
    MAX_THREADS,
    MAX_TIMEOUT_S,
    MAX_WORKERS,
    ModelConfig,
)

# The model settings (config.model_settings) and the bounds every numeric setting shares, named
# from here too.
__all__ = [
    "API_NAMES",
    "MAX_BATCH_SIZE",
    "MAX_BODY_BYTES",
    "MAX_DELAY_MS",
    "MAX_DEVICE_ID",
    "MAX_QUEUE_SIZE",
    "MAX_THREADS",
    "MAX_TIMEOUT_S",
    "MAX_WORKERS",
    "MODEL_ALIASES",
    "MODEL_IGNORED_KEYS",
    "RESTART_BACKOFF_S",
    "SEQUENCE_HEADERS",
    "Address",
    "ModelConfig",
    "ModelSpec",
    "ServerConfig",
    "parse_address",
    "parse_model_spec",
    "split_model_keys",
]

log = logging.getLogger(__name__)
_FROZEN = FROZEN


# --------------------------------------------------------------------------------------- server
class Address(BaseModel):
    """A parsed listener address."""

    model_config = _FROZEN

    scheme: Literal["http", "https"]
    host: str
    port: int = Field(ge=0, le=65535)

    @property
    def tls(self) -> bool:
        return self.scheme == "https"


def parse_address(value: str) -> Address:
    """Parse ``http(s)://host:port`` (IPv6 hosts in brackets). Raises ValueError."""
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"address must look like http://host:port, got {value!r}")
    if parts.path not in ("", "/") or parts.query:
        raise ValueError(f"address must not have a path or query, got {value!r}")
    port = parts.port  # raises ValueError for a bad port
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    return Address(scheme=parts.scheme, host=parts.hostname, port=port)


class ModelSpec(BaseModel):
    """One ``load_models`` entry: ``x.mar`` (name from the archive) or ``name=x.mar|url``."""

    model_config = _FROZEN

    name: str | None
    url: str


# TorchServe's sequence header names (its ts_header_key_sequence_* keys rename them) and a header
# name's characters (RFC 9110's token).
SEQUENCE_HEADERS = (
    "ts_request_sequence_id",
    "ts_request_sequence_start",
    "ts_request_sequence_end",
)
_SEQUENCE_KEYS = tuple(f"ts_header_key_sequence_{k}" for k in ("id", "start", "end"))
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")

# TorchServe's restart backoff (seconds), shortened: the last value repeats.
RESTART_BACKOFF_S = (0.0, 1.0, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 55.0)


class ServerConfig(GrpcSettings):
    """Everything ``torchbay serve`` needs, validated once at start (gRPC: ``GrpcSettings``)."""

    model_config = _FROZEN

    inference_address: str = "http://127.0.0.1:8080"
    management_address: str = "http://127.0.0.1:8081"
    metrics_address: str = "http://127.0.0.1:8082"
    private_key_file: Path | None = None  # TLS for https:// addresses (PEM)
    certificate_file: Path | None = None
    model_store: Path | None = None
    load_models: list[str] = Field(default_factory=list)  # "all", "x.mar", "name=x.mar|url"
    # TorchServe's workflow store (.war archives; None: the model store), and torchbay's
    # start-up workflows ("all", "x.war", "name=x.war"), which TorchServe 0.12 does not have.
    workflow_store: Path | None = None
    load_workflows: list[str] = Field(default_factory=list)
    models: dict[str, dict[str, ModelConfig]] = Field(default_factory=dict)
    default_workers_per_model: int = Field(1, ge=0, le=MAX_WORKERS)
    number_of_gpu: int | None = Field(None, ge=0, le=MAX_DEVICE_ID + 1)  # caps detected; None: all
    job_queue_size: int = Field(100, ge=1, le=MAX_QUEUE_SIZE)
    batch_size: int = Field(1, ge=1, le=MAX_BATCH_SIZE)
    max_batch_delay_ms: float = Field(100.0, ge=0, le=MAX_DELAY_MS)
    max_queue_delay_ms: float = Field(0.0, ge=0, le=MAX_DELAY_MS)  # every model's default; 0: off
    default_response_timeout_s: float = Field(120.0, gt=0, le=MAX_TIMEOUT_S)
    default_startup_timeout_s: float = Field(120.0, gt=0, le=MAX_TIMEOUT_S)
    unregister_model_timeout_s: float = Field(120.0, gt=0, le=MAX_TIMEOUT_S)
    # serve waits this long for startup models
    workers_start_timeout_s: float = Field(300.0, gt=0, le=MAX_TIMEOUT_S)
    max_request_size: int = Field(6553500, ge=1, le=MAX_BODY_BYTES)
    max_response_size: int = Field(6553500, ge=1, le=MAX_BODY_BYTES)
    limit_max_image_pixels: bool = True
    # TorchServe's: false hands JSON and text bodies to handlers as bytes (SageMaker's toolkit
    # sets it: its handler decodes them itself).
    decode_input_request: bool = True
    allowed_urls: list[str] = Field(default_factory=list)  # regexes; [] = model store only
    # bytes, for archives registered by URL
    max_download_size: int = Field(2 << 30, ge=1, le=1 << 44)
    download_timeout_s: float = Field(600.0, gt=0, le=MAX_TIMEOUT_S)
    disable_token_authorization: bool = False
    token_expiration_min: float = Field(60.0, gt=0, le=525_600)  # a year at most
    key_file: Path = Path("key_file.json")
    # Keys provided by the operator (a Kubernetes Secret mounted read-only), in key_file.json's
    # shape: used as they are, never expire, never written, deleted or rotated by the server.
    token_keys_file: Path | None = None
    enable_model_api: bool = False
    # The handler of a model whose manifest names none (a SageMaker model directory has no
    # manifest at all): TorchServe's default_service_handler, "module-or-file[:function]".
    default_service_handler: str | None = Field(None, max_length=4096)
    enable_envvars_config: bool = False
    metrics_mode: Literal["log", "prometheus", "legacy"] = "prometheus"
    # TorchServe's metrics YAML (observe.metrics_config; None: its default ts/configs/metrics.yaml)
    # and whether a handler metric it does not list is registered on first sight.
    metrics_config: Path | None = None
    model_metrics_auto_detect: bool = False
    enable_metrics_api: bool = True
    disable_system_metrics: bool = False
    log_format: Literal["text", "json"] = "text"
    access_log: bool = True  # one line per inference request on logger torchbay.access
    # A log file rolls over past this size (0: never), keeping this many older files (name.1 ...)
    log_file_max_bytes: int = Field(100 * 1024 * 1024, ge=0, le=1 << 40)
    log_file_backups: int = Field(5, ge=0, le=1000)
    # Triton's trace extension writes its traces here (and to trace_file.<k>); "" traces nothing.
    # Only the operator sets it: the trace settings API cannot change it (as in Triton).
    trace_file: str = Field("", max_length=4096)
    cpu_threads_per_worker: int | None = Field(None, ge=1, le=MAX_THREADS)  # None: budget share
    cpu_affinity: bool = False
    cpu_thread_budget: int | None = Field(None, ge=1, le=MAX_THREADS)  # all workers; None: cores
    # Many models per host (serving/multiplex.py): at most this many model versions hold
    # workers at once; the others stay registered, load on their first request and the least
    # recently used idle one is unloaded to make room. 0: off (every model keeps its workers).
    max_loaded_models: int = Field(0, ge=0, le=100_000)
    shutdown_grace_s: float = Field(30.0, ge=0, le=3600)
    # How a new worker starts: forked from a template that imported torch once (milliseconds),
    # or spawned (python and torch imported again, about a second). "fork" spawns where the
    # platform cannot fork (serving/forkserver.py).
    worker_start: Literal["fork", "spawn"] = "fork"
    restart_backoff_s: tuple[float, ...] = RESTART_BACKOFF_S
    # Archive unpacking (model store and URL registration alike): the total expanded size, and
    # the largest expanded/compressed ratio of any member past 1 MiB. Weights barely compress
    # (~1.1x), so 100x stops zip bombs (Apache POI's ZipSecureFile uses the same 1%) while a
    # multi-GB checkpoint still loads; the free disk space is checked too.
    max_archive_expanded_size: int = Field(64 << 30, ge=1, le=1 << 44)
    max_archive_compression_ratio: float = Field(100.0, ge=1, le=1e6)
    # HTTP limits on every port (nginx's client_header_timeout / client_body_timeout /
    # large_client_header_buffers; uvicorn's timeout_keep_alive): a client that never finishes its
    # headers or body is answered 408 and closed; oversized headers get 431.
    http_header_timeout_s: float = Field(30.0, gt=0, le=3600)
    http_body_timeout_s: float = Field(60.0, gt=0, le=3600)  # between two reads of the body
    keep_alive_timeout_s: float = Field(30.0, gt=0, le=3600)
    max_header_size: int = Field(64 << 10, ge=1024, le=16 << 20)  # request line + all headers
    max_header_count: int = Field(256, ge=8, le=10_000)
    # Open connections per HTTP listener; past it a new one is answered 503 and closed at once, so
    # one client's connections never take every file descriptor of the process (then no listener
    # accepts, workers cannot start). 0: a share of the open-file limit (server.http.limits).
    max_connections: int = Field(0, ge=0, le=1_000_000)
    # Triton's shared-memory extensions (server/plane/shm.py): off unless the operator allows
    # clients to name memory objects of this host, as Triton's --allow-client-shm.
    allow_client_shm: bool = False
    # TorchServe's config snapshots go here (server/config/snapshots.py); None: none written.
    # ``torchbay serve`` sets it to <log dir>/config unless --ncs; a server built in code has none.
    snapshot_dir: Path | None = None
    # The settings as the user declared them (file, environment, flags), which a snapshot
    # writes back; set by ``config.sources.load_server_config``.
    _declared: dict[str, Any] = PrivateAttr(default_factory=dict)
    # The models whose ``models`` entry is a restored snapshot's (config.model_layers).
    _restored: frozenset[str] = PrivateAttr(default_factory=frozenset)
    # perf_analyzer registers a region per input and output per data step; Triton has no bound
    shm_max_regions: int = Field(1024, ge=1, le=4096)
    shm_max_bytes: int = Field(16 << 30, ge=1, le=1 << 44)  # registered bytes, all regions
    cors_allowed_origin: str | None = None
    cors_allowed_methods: str | None = None
    cors_allowed_headers: str | None = None
    # TorchServe's: the variables (a regex over the whole name) a worker's handler must not see.
    blacklist_env_vars: str = Field("", max_length=4096)
    # The names of the headers that carry a sequence's id, start and end (TorchServe's keys and
    # defaults): the frontend reads them, the worker's handler gets them under these names
    # (``context.header_key_sequence_*``), a handler's answer ends a sequence by the third.
    ts_header_key_sequence_id: str = SEQUENCE_HEADERS[0]
    ts_header_key_sequence_start: str = SEQUENCE_HEADERS[1]
    ts_header_key_sequence_end: str = SEQUENCE_HEADERS[2]

    @field_validator("inference_address", "management_address", "metrics_address")
    @classmethod
    def _address(cls, value: str) -> str:
        parse_address(value)
        return value.strip()

    @field_validator("load_models", "allowed_urls", "load_workflows", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",")]
        if isinstance(value, list | tuple):
            value = [v for v in value if not (isinstance(v, str) and not v.strip())]
            if [v.lower() if isinstance(v, str) else v for v in value] == ["standalone"]:
                return []  # TorchServe's "load nothing" spelling
        return value

    @field_validator("metrics_mode", "log_format", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("models", mode="before")
    @classmethod
    def _models_json(cls, value: Any) -> Any:
        return gson_json.loads(value) if isinstance(value, str) else value

    @field_validator(*_SEQUENCE_KEYS)
    @classmethod
    def _header_name(cls, value: str, info: ValidationInfo) -> str:
        """An HTTP header name (a token), other than the sequence keys named before it."""
        value = value.strip()
        if not _TOKEN.fullmatch(value):
            raise ValueError("must be an HTTP header name (letters, digits, -_.!#$%&'*+^`|~)")
        others = [info.data.get(k) for k in _SEQUENCE_KEYS if k != info.field_name]
        if value.lower() in {o.lower() for o in others if isinstance(o, str)}:
            raise ValueError(f"{value!r} already names another sequence header")
        return value

    @property
    def sequence_headers(self) -> tuple[str, str, str]:
        """The sequence headers' names (id, start, end), lower-case, as the wire carries them."""
        id_, start, end = (getattr(self, k).lower() for k in _SEQUENCE_KEYS)
        return id_, start, end

    @field_validator("allowed_urls", "blacklist_env_vars")
    @classmethod
    def _regexes(cls, value: list[str] | str, info: ValidationInfo) -> list[str] | str:
        for pattern in [value] if isinstance(value, str) else value:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{info.field_name}: bad regex {pattern!r}: {exc}") from None
        return value

    @field_validator("restart_backoff_s")
    @classmethod
    def _backoff(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if not value or len(value) > 64 or any(not 0 <= v <= 3600 for v in value):
            raise ValueError("restart_backoff_s needs 1 to 64 delays, each 0 to 3600 seconds")
        return value

    @field_validator("load_models")
    @classmethod
    def _specs(cls, value: list[str]) -> list[str]:
        for spec in value:
            if spec.lower() != "all":
                parse_model_spec(spec)
        return value

    @model_validator(mode="after")
    def _check(self) -> ServerConfig:
        for name in ("inference_address", "management_address", "metrics_address"):
            if parse_address(getattr(self, name)).tls and not (
                self.private_key_file and self.certificate_file
            ):
                raise ValueError(
                    f"{name} is https:// but private_key_file and certificate_file are not both "
                    "set (Java keystores are not supported)"
                )
        if self.enable_grpc_ssl and not (self.private_key_file and self.certificate_file):
            raise ValueError("enable_grpc_ssl needs private_key_file and certificate_file")
        return self

    @property
    def inference(self) -> Address:
        return parse_address(self.inference_address)

    @property
    def management(self) -> Address:
        return parse_address(self.management_address)

    @property
    def metrics(self) -> Address:
        return parse_address(self.metrics_address)

    @property
    def load_all(self) -> bool:
        """``load_models=all``: every archive in the model store."""
        return any(spec.lower() == "all" for spec in self.load_models)

    def model_specs(self) -> list[ModelSpec]:
        """The named ``load_models`` entries (``all`` excluded, see ``load_all``)."""
        return [parse_model_spec(s) for s in self.load_models if s.lower() != "all"]

    def restart_delay_s(self, attempt: int) -> float:
        """Delay before restart number ``attempt`` (0-based) of a failed worker."""
        return self.restart_backoff_s[min(max(attempt, 0), len(self.restart_backoff_s) - 1)]


def parse_model_spec(spec: str) -> ModelSpec:
    """``x.mar`` -> (None, "x.mar"); ``name=x.mar`` or ``name=https://...`` -> (name, url)."""
    spec = spec.strip()
    name, sep, url = spec.partition("=")
    if sep and ("/" in name or ":" in name):  # a bare URL whose query has "="
        name, sep, url = "", "", spec
    if not sep:
        name, url = "", spec
    if not url or (sep and not name.strip()):
        raise ValueError(f"load_models entry must be 'x.mar' or 'name=x.mar', got {spec!r}")
    return ModelSpec(name=name.strip() or None, url=url.strip())
