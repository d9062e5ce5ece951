"""Writing TorchServe's config snapshots: the declared settings and every model's state.

``model_snapshot`` holds, per model and version, TorchServe's keys (``defaultVersion``,
``marName``, ``minWorkers``, ``maxWorkers``, ``batchSize``, ``maxBatchDelay``,
``responseTimeout``, ``startupTimeout``, ``runtimeType``: the registered runtime, which a
restore ignores) and every other model setting that
differs from its default, under its model-config.yaml name, live changes included: a restore
starts each version as it was. A version registered from a URL keeps that URL as its ``marName``
(torchbay does not keep downloads in the model store), so a restore downloads it again, within
``allowed_urls``. A version being unloaded is left out, and so are a workflow's nodes (TorchServe's
snapshots hold no workflow; the workflow loads again from ``load_workflows``).

Files, names and what a start restores: config/snapshots.py. Writing never fails an operation:
an unwritable folder is logged and the operation's answer stands. Torch-free.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from torchbay.server.config.settings import ServerConfig
from torchbay.server.config.snapshots import (
    declared_properties,
    format_properties,
    snapshot_name,
    write_snapshot,
)
from torchbay.server.plane.describe import runtime_of, whole_number
from torchbay.server.serving.model import ModelStatus, ModelVersion
from torchbay.server.serving.registry import ModelRegistry

log = logging.getLogger("torchbay.snapshots")

# TorchServe's own keys, written for every version (Model.getModelState), from the live settings.
_TS_KEYS = {
    "minWorkers": "min_workers",
    "maxWorkers": "max_workers",
    "batchSize": "batch_size",
    "maxBatchDelay": "max_batch_delay_ms",
    "responseTimeout": "response_timeout_s",
    "startupTimeout": "startup_timeout_s",
}
# Settings the archive gives again on restore, or that the snapshot writes its own way.
_NOT_WRITTEN = frozenset({"handler_config", "mar_name", "default_version"})


class Snapshots:
    """Writes ``startup``, ``snapshot`` and ``shutdown`` files into ``config.snapshot_dir``
    (nothing when it is None: ``--ncs``, or a server built in code)."""

    def __init__(self, config: ServerConfig, registry: ModelRegistry) -> None:
        self.config = config
        self.registry = registry
        self.directory: Path | None = config.snapshot_dir
        self._last: datetime | None = None  # the newest name's time, to the millisecond
        # Versions left out: a workflow's nodes (server/workflows sets it), as TorchServe.
        self.skip: Callable[[ModelVersion], bool] = lambda mv: False
        self.stopped = False  # the shutdown snapshot is written: it stays the newest

    def save(self, kind: str = "snapshot") -> Path | None:
        """Write one snapshot of ``kind``; its path, or None when off or not written."""
        if self.directory is None or self.stopped:
            return None
        # A change that ends during the drain (an asynchronous scale) writes nothing after the
        # shutdown snapshot: every version closing then, its snapshot would hold no model.
        self.stopped = kind == "shutdown"
        name = snapshot_name(kind, self._next_time())
        props = declared_properties(self.config._declared)
        props["model_snapshot"] = _json(self.model_snapshot(name))
        try:
            path = write_snapshot(self.directory, name, format_properties(props))
        except (OSError, ValueError) as exc:  # ValueError: UnicodeEncodeError
            log.error("config snapshot %s not written: %s", name, exc)
            return None
        if path is None:
            log.error("config snapshot %s already exists; not written", name)
        return path

    def _next_time(self) -> datetime:
        """Now to the millisecond, or a millisecond past the last name's when that is not
        earlier: a change within the same millisecond as the last (two answers of one loop
        turn) gets a newer name, not a refusal, so the newest snapshot is the last state."""
        now = datetime.now()
        now = now.replace(microsecond=now.microsecond // 1000 * 1000)
        if self._last is not None and now <= self._last:
            now = self._last + timedelta(milliseconds=1)
        self._last = now
        return now

    def model_snapshot(self, name: str) -> dict[str, Any]:
        """TorchServe's ``model_snapshot`` object for the registry as it is now."""
        models: dict[str, dict[str, Any]] = {}
        for mv in self.registry.all_versions():
            if mv.closing or mv.status is ModelStatus.FAILED or self.skip(mv):
                continue  # on its way out, never served, or a workflow's node
            models.setdefault(mv.name, {})[mv.version] = self._state(mv)
        count = sum(len(versions) for versions in models.values())
        created = int(time.time() * 1000)
        return {"name": name, "modelCount": count, "created": created, "models": models}

    def _state(self, mv: ModelVersion) -> dict[str, Any]:
        state: dict[str, Any] = {
            "defaultVersion": self.registry.is_default(mv),
            "marName": _mar_name(mv),
        }
        settings = mv.settings
        for key, field in _TS_KEYS.items():  # integers, as TorchServe writes them
            state[key] = whole_number(getattr(settings, field, None))
        state["runtimeType"] = runtime_of(mv)  # the registered one, as TorchServe writes it
        if mv.config is not None:
            own = mv.config.model_dump(
                mode="json", by_alias=True, exclude_defaults=True, exclude=set(_NOT_WRITTEN)
            )
            state.update({k: v for k, v in own.items() if k not in state})
        return state


def _mar_name(mv: ModelVersion) -> str:
    """What a restore registers again: the store-relative archive name, or the URL."""
    url = mv.url
    if url.startswith("file://"):
        url = url[len("file://") :]
    return url


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
