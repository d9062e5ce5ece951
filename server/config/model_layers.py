"""The JSON of ``models={...}`` and of TorchServe's ``model_snapshot``: model name -> version ->
settings, each the first layer of that version's settings (``sources.resolve_model_config``),
read as TorchServe's Gson reads them (config.gson_json: single quotes, comments, ...).

The two rank differently against the archive's model-config.yaml, as in TorchServe: a
``models={...}`` entry is a default the archive's YAML overrides (``getJsonIntValue`` only when
the archive gives no value), while a snapshot's entry is the state the version ran with, its
scaled workers and tuned settings, set over the archive's (``Model.setModelState`` on restore).
``normalize_models`` names the models whose entry is a snapshot's (``RESTORED``), so that
``resolve_model_config`` applies them after the YAML (``version_entry``). Torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from torchbay.server.config import gson_json
from torchbay.server.config.model_keys import split_model_keys
from torchbay.server.errors import ConfigError

# A config layer's key for the names of its ``models`` that came from its model_snapshot: set
# with ``models`` in every layer that has one, so both come from the layer that wins the merge.
RESTORED = "_restored_models"


def normalize_models(out: dict[str, Any], snapshot: dict[str, Any]) -> None:
    """Merge a layer's ``model_snapshot`` models into its ``models`` (a ``models={...}`` entry
    of the same name wins) and record which names are the snapshot's under ``RESTORED``."""
    given = out.get("models", {})
    if snapshot:
        out["models"] = {**snapshot, **given}
    if "models" in out:
        out[RESTORED] = frozenset(snapshot) - frozenset(given)


def snapshot_models(value: str | Mapping[str, Any], where: str, notes: list[str]) -> dict[str, Any]:
    """TorchServe's ``model_snapshot`` (KServe's config.properties names its models this way):
    its ``models`` load like ``models={...}`` entries; the rest (name, counts) is not used."""
    if isinstance(value, str):
        try:
            value = gson_json.loads(value)
        except (json.JSONDecodeError, RecursionError) as exc:  # nested too deep: no ValueError
            raise ConfigError(f"{where}: model_snapshot is not valid JSON: {exc}") from exc
    if not isinstance(value, Mapping) or not isinstance(value.get("models", {}), Mapping):
        raise ConfigError(f"{where}: model_snapshot must be an object with a models object")
    return models_layer(value.get("models", {}), f"{where}: model_snapshot", notes)


def models_layer(value: str | Mapping[str, Any], where: str, notes: list[str]) -> dict[str, Any]:
    """The ``models={...}`` JSON: name -> version -> settings, unknown keys noted and dropped."""
    if isinstance(value, str):
        try:
            value = gson_json.loads(value)
        except (json.JSONDecodeError, RecursionError) as exc:  # nested too deep: no ValueError
            raise ConfigError(f"{where}: models= is not valid JSON: {exc}") from exc
        if value is None:  # models= with nothing after it (Gson's null): no models
            return {}
    if not isinstance(value, Mapping) or not all(isinstance(v, Mapping) for v in value.values()):
        raise ConfigError(f"{where}: models= must map model name -> version -> settings")
    out: dict[str, dict[str, Any]] = {}
    for name, versions in value.items():
        out[name] = {}
        for version, settings in versions.items():
            if not isinstance(settings, Mapping):
                raise ConfigError(f"{where}: models.{name}.{version} must be an object")
            fields, _, more = split_model_keys(
                settings, where=f"{where}: models.{name}.{version}", backend_params=False
            )
            notes.extend(more)
            out[name][version] = fields
    return out


def version_entry(
    models: Mapping[str, Mapping[str, Any]],
    restored: frozenset[str],
    name: str,
    version: str,
    url: str | None,
) -> tuple[dict[str, Any], bool]:
    """The ``models`` entry (``ServerConfig.models``) of ``name``'s ``version`` as a settings
    layer, and whether it is a restored snapshot's. A snapshot's model whose archive ``url``
    (its ``marName``) holds another version now (replaced since) gets that archive's entry:
    TorchServe restores the entry's state onto whatever version the archive holds."""
    versions = models.get(name, {})
    entry = versions.get(version)
    is_restored = name in restored
    if entry is None and is_restored and url:
        same = [e for e in versions.values() if e.mar_name == url]
        entry = same[0] if len(same) == 1 else None
    return (entry.model_dump(exclude_unset=True) if entry is not None else {}), is_restored
