"""How TorchServe 0.12's ConfigManager reads a value, where that is not the plain reading
(config.sources applies these to config.properties and the ``TS_*`` environment):

* ``$$NAME$$`` in a config.properties value is the environment variable ``NAME``
  (``resolveEnvVarVals``, always on); one that is not set refuses the file, as TorchServe
  refuses to start ("Invalid Environment Variable").
* An environment variable is the name of a ConfigManager field (``setSystemVars``), mostly
  ``TS_<KEY>``, but a few fields are named otherwise (``ENV_NAMES``); ``TS_ALLOWED_URLS`` is read
  only when config.properties sets ``use_env_allowed_urls=true`` (for security, TorchServe's
  docs say), else ignored with a note.
* A boolean key is Java's ``Boolean.parseBoolean``: ``true`` in any case is true, anything else
  is false (``yes``, ``1`` and ``on`` too, which pydantic would read as true: a
  ``disable_token_authorization=1`` must not turn authorization off where TorchServe keeps it
  on); ``decode_input_request`` is true only as exactly ``true`` (ts/protocol's worker compares
  the string). A value other than ``true``/``false`` is noted with how it reads.

``SERVER_IGNORED_KEYS`` are TorchServe's config.properties keys torchbay takes and does not use
(noted as such, not as unknown keys). Torch-free; imports nothing of ours but errors.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torchbay.server.errors import ConfigError

# ConfigManager's fields whose names are not TS_<KEY>: environment variable -> key.
ENV_NAMES = {
    "TS_TOKEN_EXPIRATION_TIME_MIN": "token_expiration_min",
    "TS_HEADER_KEY_SEQUENCE_ID": "ts_header_key_sequence_id",
    "TS_HEADER_KEY_SEQUENCE_START": "ts_header_key_sequence_start",
    "TS_HEADER_KEY_SEQUENCE_END": "ts_header_key_sequence_end",
}
# The boolean keys TorchServe reads with Boolean.parseBoolean and torchbay honours; not
# enable_grpc_ssl, whose junk refuses the file (config.lenient.UNSAFE: plain text is not the
# safe reading) and whose 1 or yes turns TLS on.
JAVA_BOOLEANS = frozenset(
    {
        "enable_metrics_api",
        "disable_token_authorization",
        "enable_model_api",
        "model_metrics_auto_detect",
        "disable_system_metrics",
        "limit_max_image_pixels",
    }
)
EXACT_TRUE = frozenset({"decode_input_request"})  # the worker's os.environ[...] == "true"
ALLOWED_URLS_GATE = "use_env_allowed_urls"
# TorchServe config.properties keys torchbay accepts and ignores (noted, never fatal).
SERVER_IGNORED_KEYS = frozenset(
    {
        "vmargs",
        "number_of_netty_threads",
        "netty_client_threads",
        "prefer_direct_buffer",
        "async_logging",
        "install_py_dep_per_model",
        "initial_worker_port",
        "initial_distribution_port",
        "system_metrics_cmd",
        "plugins_path",
        "keystore",
        "keystore_pass",
        "keystore_type",
        "tsConfigFile",
        "model_server_home",
        "ipex_enable",
        "ipex_gpu_enable",
        "cpp_log_config",
        "use_native_io",
        "io_ratio",
        "service_envelope",
        "max_idle_time",
        "enable_grpc",
        "ts_config_file",
        "log_location",
        "metrics_location",
        "headless",
        "metrics_format",
        # ConfigManager's own, found in the snapshots it writes, and its other switches
        "version",
        "python",
        "debug",
        "cpu_launcher_enable",
        "cpu_launcher_args",
        "metric_time_interval",
        "ts_open_inference_protocol",
    }
)
_VARIABLE = re.compile(r"\$\$([^$]+[^$])\$\$")  # ConfigManager's pattern


def env_key(name: str) -> str | None:
    """The key a ``TS_*`` environment variable sets (None: not one)."""
    if name in ENV_NAMES:
        return ENV_NAMES[name]
    return name[3:].lower() if name.startswith("TS_") else None


def substituted(props: Mapping[str, str], env: Mapping[str, str]) -> dict[str, str]:
    """``props`` with each ``$$NAME$$`` replaced by ``env[NAME]``; ConfigError names a
    variable that is not set."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in env:
            raise ConfigError(f"Invalid Environment Variable {name} (in config.properties)")
        return env[name]

    return {key: _VARIABLE.sub(value, text) for key, text in props.items()}


def java_values(raw: Mapping[str, Any], where: str, notes: list[str]) -> dict[str, Any]:
    """``raw`` (a file's or the environment's text values) with the boolean keys read as
    TorchServe reads them; a value other than ``true``/``false`` is noted."""
    out = dict(raw)
    for key, value in raw.items():
        if not isinstance(value, str) or key not in JAVA_BOOLEANS | EXACT_TRUE:
            continue
        text = value.strip() if key in EXACT_TRUE else value.strip().lower()
        out[key] = text == "true"
        if text not in ("true", "false"):
            notes.append(
                f"WARNING {where}: {key}={value!r} reads as {str(out[key]).lower()}, as "
                "TorchServe reads it"
            )
    return out


def allowed_urls_gate(
    ts_env: dict[str, Any], props: Mapping[str, Any], notes: list[str]
) -> dict[str, Any]:
    """``ts_env`` without ``allowed_urls`` unless the file's ``use_env_allowed_urls`` is true."""
    if "allowed_urls" not in ts_env:
        return ts_env
    gate = props.get(ALLOWED_URLS_GATE)
    if isinstance(gate, str) and gate.strip().lower() == "true":
        return ts_env
    notes.append(
        "ignored TS_ALLOWED_URLS: TorchServe reads it only with use_env_allowed_urls=true in "
        "config.properties"
    )
    return {k: v for k, v in ts_env.items() if k != "allowed_urls"}
