"""What a worker is launched with, written down once.

``ModelSettings`` are a model version's live-tunable settings (resolved once from every source by
the registry; live changes make a new frozen copy); its fields are derived from the settings
declared in ``config.model_settings`` (``settings_from`` takes them by name). ``LaunchSpec`` is
everything that starts one worker: the model, the handler, the device and threads, the
environment and the log format. The ``Load`` message (the spec serialized by field name) and
the spawn arguments both come from it (:meth:`LaunchSpec.load_message`,
:meth:`LaunchSpec.new_worker`), so no launch fact is copied anywhere else. Torch-free.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, make_dataclass, replace
from pathlib import Path
from typing import Any

from torchbay.server.config.model_settings import SETTINGS, Setting
from torchbay.server.config.settings import (
    RESTART_BACKOFF_S,
    SEQUENCE_HEADERS,
    ModelConfig,
    ServerConfig,
)
from torchbay.server.serving import protocol as p
from torchbay.server.serving.handle import SpawnFn, WorkerProcess
from torchbay.server.serving.worker_env import visible_env

_SETTINGS_DOC = """The live settings of one model version (already resolved from every source): the
model settings declared ``serving`` in ``config.model_settings`` and the server-wide ones."""


def _updated(self: Any, **changes: Any) -> Any:
    """A copy with the given (non-None) changes."""
    return replace(self, **{k: v for k, v in changes.items() if v is not None})


def settings_class(settings: Mapping[str, Setting]) -> type:
    """``ModelSettings``: a frozen dataclass of every setting declared ``serving`` (its default
    ``ModelConfig``'s), then the server-wide ones the running version reads."""
    model = [
        (s.name, s.annotation, field(default=s.default)) for s in settings.values() if s.serving
    ]
    server = [
        # The server's restart back-off, by failure count, and its cap on one response body
        # (0: no limit).
        ("restart_backoff_s", tuple[float, ...], field(default=RESTART_BACKOFF_S)),
        ("max_response_size", int, field(default=0)),
        # The sequence headers' names (id, start, end; lower-case: ServerConfig's).
        ("sequence_headers", tuple[str, str, str], field(default=SEQUENCE_HEADERS)),
    ]
    namespace = {"updated": _updated, "__doc__": _SETTINGS_DOC}
    cls = make_dataclass("ModelSettings", [*model, *server], frozen=True, namespace=namespace)
    cls.__module__ = __name__  # (make_dataclass's own module= needs Python 3.12)
    return cls


ModelSettings = settings_class(SETTINGS)
_SERVING = tuple(name for name, s in SETTINGS.items() if s.serving)


def settings_from(config: ModelConfig, server: ServerConfig | None = None) -> ModelSettings:
    """A model's live settings; the server-wide ones (restart back-off, response limit) from
    ``server`` when given."""
    extra: dict[str, Any] = {}
    if server is not None:
        extra = {
            "restart_backoff_s": server.restart_backoff_s,
            "max_response_size": server.max_response_size,
            "sequence_headers": server.sequence_headers,
        }
    return ModelSettings(**{name: getattr(config, name) for name in _SERVING}, **extra)


# The launch facts that are server settings of the same name.
_SERVER_FACTS = (
    "limit_max_image_pixels",
    "max_request_size",
    "max_response_size",
    "decode_input_request",
    "sequence_headers",
    "blacklist_env_vars",
    "log_format",
)


def server_facts(server: ServerConfig) -> dict[str, Any]:
    """The ``LaunchSpec`` fields that ``server`` sets (by the settings of their names)."""
    return {name: getattr(server, name) for name in _SERVER_FACTS}


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one worker runs: a GPU id (None = CPU), its torch threads, optional core affinity."""

    gpu_id: int | None
    threads: int
    cpu_affinity: tuple[int, ...] | None = None


@dataclass(frozen=True)
class LaunchSpec:
    """Everything one worker starts with. A model version holds one (its placement and batch
    size left at their defaults); each slot derives its own with :meth:`placed`."""

    model_dir: Path
    model_name: str
    model_version: str
    handler: str | None = None  # overrides the manifest's handler (management API)
    server_version: str = ""
    limit_max_image_pixels: bool = True
    max_request_size: int = 6553500  # the worker's cap on a decompressed request body
    max_response_size: int = 0  # the worker's cap on one response body (0: none)
    decode_input_request: bool = True  # false: JSON and text bodies reach the handler as bytes
    # The sequence headers' names (id, start, end): the handler's context.header_key_sequence_*
    sequence_headers: tuple[str, str, str] = SEQUENCE_HEADERS
    blacklist_env_vars: str = ""  # TorchServe's: variables (whole names) the handler never sees
    env: Mapping[str, str] | None = None  # None: the server's own environment
    log_format: str = "text"
    # metrics_config's model_metrics, which the handler's metrics cache starts with
    model_metrics: tuple[tuple[str, str, str, tuple[str, ...]], ...] = ()
    batch_size: int = 1
    placement: Placement = Placement(gpu_id=None, threads=1)

    def placed(self, placement: Placement, batch_size: int) -> LaunchSpec:
        return replace(self, placement=placement, batch_size=batch_size)

    def load_message(self) -> p.Load:
        """The ``Load`` message: this spec and its placement, serialized by field name (the
        wire's ``num_threads`` is the placement's ``threads``)."""
        facts = {f.name: getattr(self, f.name) for f in fields(self)}
        where = self.placement
        facts.update({f.name: getattr(where, f.name) for f in fields(where)})
        facts["num_threads"] = facts.pop("threads")
        return p.Load(**{f.name: _wire(facts[f.name]) for f in fields(p.Load)})

    def new_worker(self, spawn: SpawnFn | None = None) -> WorkerProcess:
        env = self.env
        if self.blacklist_env_vars:
            env = visible_env(os.environ if env is None else env, self.blacklist_env_vars)
        return WorkerProcess(self.load_message(), env=env, log_format=self.log_format, spawn=spawn)


def _wire(value: Any) -> Any:
    """A launch fact as the wire carries it: paths as text, core lists as lists (none: None)."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value) or None
    return value
