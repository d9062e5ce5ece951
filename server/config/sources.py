"""Where settings come from, and how they layer (see ``config``'s docstring for the order).

``load_server_config`` layers config.properties, the environment and command-line flags into a
``ServerConfig``; ``resolve_model_config`` layers a model's sources into its ``ModelConfig``.
Torch-free; nothing here reads ``os.environ`` (the CLI passes the environment in).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchbay.server.config import lenient
from torchbay.server.config.metrics_config import check_published, load_metrics_config
from torchbay.server.config.model_layers import (
    RESTORED,
    models_layer,
    normalize_models,
    snapshot_models,
    version_entry,
)
from torchbay.server.config.properties import PropertiesError, decoded, parse_properties
from torchbay.server.config.settings import (
    API_NAMES,
    MAX_THREADS,
    ModelConfig,
    ServerConfig,
    split_model_keys,
)
from torchbay.server.config.snapshots import last_snapshot
from torchbay.server.config.ts_values import (
    ALLOWED_URLS_GATE,
    SERVER_IGNORED_KEYS,
    allowed_urls_gate,
    env_key,
    java_values,
    substituted,
)
from torchbay.server.errors import ConfigError

log = logging.getLogger("torchbay.server.config")  # one logger for all of config

# --------------------------------------------------------------------------------------- loading
# TorchServe property name -> ServerConfig field, where they differ (field names work as keys too).
SERVER_KEY_ALIASES = {
    "max_batch_delay": "max_batch_delay_ms",
    "default_response_timeout": "default_response_timeout_s",
    "default_startup_timeout": "default_startup_timeout_s",
    "unregister_model_timeout": "unregister_model_timeout_s",
    "cors_allowed_origins": "cors_allowed_origin",
}
_FIELDS = frozenset(ServerConfig.model_fields)
# Every key a config source may name (model_snapshot: TorchServe's snapshot, see _normalize).
_KNOWN_KEYS = _FIELDS | SERVER_KEY_ALIASES.keys() | SERVER_IGNORED_KEYS | {"model_snapshot"}
_PATH_FIELDS = (
    "model_store",
    "workflow_store",
    "key_file",
    "token_keys_file",
    "private_key_file",
    "certificate_file",
    "metrics_config",
)


def load_server_config(
    *,
    ts_config: str | Path | None,
    env: Mapping[str, str],
    cli: Mapping[str, Any],
    cwd: str | Path | None = None,
    snapshots: Path | None = None,
) -> tuple[ServerConfig, list[str]]:
    """Layer every server source and validate once. Returns the config and notes to log.

    ``ts_config`` (``--ts-config``) else ``env["TS_CONFIG_FILE"]`` else ``<cwd>/config.properties``
    if it exists. ``cli`` holds only flags the user set (keys: field or TorchServe names; ``None``
    values are skipped). Relative paths (``model_store``, ``key_file``, TLS files) resolve against
    ``cwd`` (default: the process's cwd). ``snapshots``: TorchServe's config snapshots folder;
    with neither ``--ts-config`` nor ``TS_CONFIG_FILE``, its newest snapshot is read instead of
    ``config.properties`` (config/snapshots.py); a configuration with a ``model_snapshot`` loads
    that snapshot's models, not ``load_models`` / ``--models`` (TorchServe's precedence).
    Raises ConfigError (unreadable file, bad models= JSON, unknown cli key) or ValidationError.
    """
    base = Path(cwd) if cwd is not None else Path.cwd()
    notes: list[str] = []
    path = _config_path(ts_config, env, base, snapshots)
    raw_props = substituted(_read_properties(path), env) if path is not None else {}
    props = _normalize(java_values(raw_props, f"{path}", notes), f"{path}", notes)
    if path is not None:
        notes.insert(0, f"configuration from {path}")
    unknown_cli = [k for k in cli if k not in _FIELDS and k not in SERVER_KEY_ALIASES]
    if unknown_cli:
        raise ConfigError(f"unknown command-line setting(s): {', '.join(sorted(unknown_cli))}")
    flags = _normalize({k: v for k, v in cli.items() if v is not None}, "command line", notes)
    own_env = _normalize(_env_layer(env, "TORCHBAY_", notes, known_only=False), "env", notes)
    envvars_on = {**props, **own_env, **flags}.get("enable_envvars_config", False)
    ts_env_raw = _env_layer(env, "TS_", notes, known_only=True)
    ts_env: dict[str, Any] = {}
    if _truthy(envvars_on):
        ts_env_raw = allowed_urls_gate(ts_env_raw, raw_props, notes)
        ts_env = _normalize(java_values(ts_env_raw, "env", notes), "env", notes)
    elif ts_env_raw:
        names = ", ".join(f"TS_{k.upper()}" for k in ts_env_raw)
        notes.append(f"ignored {names}: TorchServe env vars need enable_envvars_config=true")
    merged = {"key_file": "key_file.json", **props, **ts_env, **own_env, **flags}
    restored = merged.pop(RESTORED, frozenset())
    for key in _PATH_FIELDS:
        if merged.get(key) not in (None, ""):
            merged[key] = base / Path(merged[key])
    _omp_threads(env, merged, notes)
    restoring = "model_snapshot" in raw_props or (ts_env and "model_snapshot" in ts_env_raw)
    if restoring and merged.pop("load_models", None):  # TorchServe's precedence
        notes.append("model_snapshot given: its models load; load_models and --models ignored")
    config = lenient.validate(merged, props, f"{path}", notes)  # a bad line warns, see there
    config._declared = _declared({**raw_props, **ts_env, **own_env, **flags}, base)
    config._restored = restored
    if config.metrics_config is not None:  # its errors now, named, not at the first request
        spec, host = load_metrics_config(config.metrics_config), not config.disable_system_metrics
        check_published(spec, config.metrics_mode, host=host)
    return config, notes


def _omp_threads(env: Mapping[str, str], merged: dict[str, Any], notes: list[str]) -> None:
    """``MKL_NUM_THREADS``, else ``OMP_NUM_THREADS``, in the server's environment, when no source
    set ``cpu_threads_per_worker``, becomes it: TorchServe's workers inherit the variables and
    torch starts that many intra-op threads (the first of the two that holds a count, torch's
    order), where torchbay's budget (serving/budget.py) would otherwise set its own share. The
    first level (``4,2`` is OpenMP's nested form) is read; a value that is not a thread count in
    bounds is noted and ignored."""
    if merged.get("cpu_threads_per_worker") is not None:
        return
    chosen: tuple[str, str, int] | None = None
    for name in ("MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        raw = env.get(name, "").strip()
        if not raw:  # empty: as OpenMP, unset
            continue
        first = raw.split(",", 1)[0].rstrip()
        threads = int(first) if first.isdigit() else 0
        if not 1 <= threads <= MAX_THREADS:
            notes.append(f"WARNING ignored {name}={raw!r}: not 1 to {MAX_THREADS} threads")
        elif chosen is None:
            chosen = (name, raw, threads)
    if chosen is not None:
        name, raw, threads = chosen
        merged["cpu_threads_per_worker"] = threads
        notes.append(f"{name}={raw}: every CPU worker runs {threads} intra-op thread(s)")


def _config_path(
    ts_config: str | Path | None, env: Mapping[str, str], base: Path, snapshots: Path | None
) -> Path | None:
    chosen = ts_config if ts_config not in (None, "") else env.get("TS_CONFIG_FILE") or None
    if chosen is not None:
        path = base / Path(chosen)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        return path
    last = last_snapshot(base / snapshots) if snapshots is not None else None
    if last is not None:
        return last
    default = base / "config.properties"
    return default if default.is_file() else None


def _declared(raw: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """The settings as declared (the file's under its names), relative paths made absolute
    against ``base`` so that a snapshot of them means the same from any directory."""
    out: dict[str, Any] = dict(raw)
    for key, value in raw.items():
        if SERVER_KEY_ALIASES.get(key, key) in _PATH_FIELDS and value not in (None, ""):
            out[key] = str(base / Path(value))
    return out


def _read_properties(path: Path) -> dict[str, str]:
    try:
        return parse_properties(decoded(path.read_bytes()))
    except (OSError, PropertiesError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc


def _truthy(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def _env_layer(
    env: Mapping[str, str], prefix: str, notes: list[str], *, known_only: bool
) -> dict[str, str]:
    """``PREFIX_<KEY>`` variables as {key: value}. Unknown ones are noted (or skipped)."""
    out: dict[str, str] = {}
    for name, value in env.items():
        if not name.startswith(prefix) or name == "TS_CONFIG_FILE":
            continue
        key = env_key(name) if prefix == "TS_" else name[len(prefix) :].lower()
        if key in _KNOWN_KEYS:
            out[key] = value
        elif not known_only:
            notes.append(f"ignored unknown environment variable {name}")
    return out


def _normalize(raw: Mapping[str, Any], where: str, notes: list[str]) -> dict[str, Any]:
    """Map TorchServe names to fields; drop (and note) ignored and unknown keys."""
    out: dict[str, Any] = {}
    snapshot: dict[str, Any] = {}
    for key, value in raw.items():
        field = SERVER_KEY_ALIASES.get(key, key)
        if key == "model_snapshot" and isinstance(value, str | Mapping):
            snapshot = snapshot_models(value, where, notes)
        elif key == ALLOWED_URLS_GATE:  # read by allowed_urls_gate
            continue
        elif key in SERVER_IGNORED_KEYS:
            notes.append(f"{where}: ignored TorchServe key {key!r} (not used by torchbay)")
        elif field not in _FIELDS:
            notes.append(f"{where}: ignored unknown key {key!r}")
        elif field == "models" and isinstance(value, str | Mapping):
            out[field] = models_layer(value, where, notes)
        else:
            out[field] = value
    normalize_models(out, snapshot)  # a models= entry of the same name wins over the snapshot's
    return out


# --------------------------------------------------------------------------------------- resolve
def resolve_model_config(
    server: ServerConfig,
    *,
    name: str,
    version: str,
    archive_yaml: Mapping[str, Any] | None,
    api_overrides: Mapping[str, Any] | None,
    default_workers: int | None = None,
    url: str | None = None,
) -> ModelConfig:
    """The settings of one model version, TorchServe's precedence, later wins::

        ServerConfig defaults < server.models[name][version] < model-config.yaml < management API

    but an entry of a restored ``model_snapshot`` ranks over model-config.yaml, as TorchServe
    restores a version as it ran; ``url``: the archive registered, which finds a snapshot's entry
    written for another version of it (config.model_layers.version_entry).

    ``archive_yaml`` is the parsed model-config.yaml (camelCase); keys that are not frontend
    settings become ``handler_config``; TorchServe keys torchbay ignores are logged.
    ``api_overrides`` holds only the parameters present in the request, by TorchServe name
    (``batch_size``, ``max_batch_delay``, ``initial_workers``, ``response_timeout``,
    ``startup_timeout``, ``min_worker``, ``max_worker``, ``handler``) or by field name.
    A layer that raises ``min_workers`` without giving ``max_workers`` raises the maximum with it.
    Unlike TorchServe, ``initial_workers`` beats a yaml ``minWorkers>0`` (the API always wins).
    ``default_workers`` replaces ``default_workers_per_model`` as the first layer's worker count
    (TorchServe registers through the API with 0 workers unless the server sets the default).
    Raises ValidationError for bad values, ConfigError for an unknown API parameter.
    """
    workers = server.default_workers_per_model if default_workers is None else default_workers
    merged: dict[str, Any] = {
        "min_workers": workers,
        "max_workers": workers,
        "batch_size": server.batch_size,
        "max_batch_delay_ms": server.max_batch_delay_ms,
        "response_timeout_s": server.default_response_timeout_s,
        "startup_timeout_s": server.default_startup_timeout_s,
        "job_queue_size": server.job_queue_size,
        "max_queue_delay_ms": server.max_queue_delay_ms,
        "cpu_threads": server.cpu_threads_per_worker,
        "cpu_affinity": server.cpu_affinity,
    }
    # A restored snapshot's entry ranks over the archive's YAML (model_layers).
    first, restored = version_entry(server.models, server._restored, name, version, url)
    _apply(merged, {} if restored else first)
    if archive_yaml:
        fields, backend, notes = split_model_keys(
            archive_yaml, where=f"model {name} {version} model-config.yaml", backend_params=True
        )
        for note in notes:
            log.info("%s", note)
        _apply(merged, {**fields, "handler_config": backend})
    _apply(merged, first if restored else {})
    if api_overrides:
        _apply(merged, _api_fields(api_overrides))
    return ModelConfig.model_validate(merged)


def _api_fields(params: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key in API_NAMES:  # register's initial_workers too
            out[API_NAMES[key]] = value
        elif key in ModelConfig.model_fields:
            out[key] = value
        else:
            raise ConfigError(f"unknown model setting {key!r}")
    return out


def _apply(merged: dict[str, Any], layer: Mapping[str, Any]) -> None:
    if "min_workers" in layer and "max_workers" not in layer:
        # TorchServe: max defaults to min. Coerce here so "4" from a query string compares.
        new_min = _as_int(layer["min_workers"])
        old_max = _as_int(merged.get("max_workers"))
        if new_min is not None and (old_max is None or old_max < new_min):
            merged["max_workers"] = new_min
    merged.update(layer)


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: YAML's .inf
        return None  # validation reports it


# ------------------------------------------------------------------ management API parameters
# TorchServe parses query parameters leniently (NettyUtils.getIntParameter: Integer.parseInt, and
# the default on NumberFormatException; Boolean.parseBoolean): junk is "not given", not a 400.
_JAVA_INT = re.compile(r"[+-]?[0-9]+")


def api_int(value: Any) -> int | None:
    """A TorchServe integer parameter: None when absent or not an integer (the default). A
    JSON body's number without a fraction (``4.0``) is that integer, as TorchServe's Gson reads
    it into an int field; ``4.5`` is junk."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, str) and len(value) <= 20 and _JAVA_INT.fullmatch(value):
        return int(value)  # beyond int32 too: the bounds check refuses it, not a silent default
    return None


def api_number(value: Any) -> float | None:
    """An integer parameter torchbay also takes as a decimal (milliseconds, seconds)."""
    number = api_int(value)
    if number is not None:
        return float(number)
    if isinstance(value, bool) or not isinstance(value, str | float):
        return None
    try:
        result = float(value)
    except ValueError:
        return None
    return result if math.isfinite(result) else None


def api_bool(value: Any, default: bool) -> bool:
    """Java's Boolean.parseBoolean: "true" in any case is true, anything else given is false."""
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    return isinstance(value, str) and value.lower() == "true"


def positive_or_none(value: float | None) -> float | None:
    """TorchServe's sentinel: a value <= 0 means "use the default"."""
    return value if value is not None and value > 0 else None
