"""Model settings declared once (config/model_settings.py): what each declaration reaches, and
that a new one reaches the API, the live settings and describe without other edits."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field, ValidationError

from torchbay.server.config.model_settings import (
    API_NAMES,
    SETTINGS,
    ModelConfig,
    Setting,
    api_names,
    check_model_settings,
    declared,
)
from torchbay.server.errors import BadRequest
from torchbay.server.plane.describe import described
from torchbay.server.plane.params import (
    REGISTERED,
    register_model,
    register_params,
    scale_params,
)
from torchbay.server.serving import protocol as p
from torchbay.server.serving.launch import (
    LaunchSpec,
    ModelSettings,
    Placement,
    settings_class,
    settings_from,
)
from torchbay.server.serving.model import LIVE_SETTINGS

NUMERIC = {name: s for name, s in SETTINGS.items() if s.bounded()}


def _off_default(setting: Setting) -> Any:
    """A value within the setting's bounds that is not its default."""
    value = (setting.lower or 0) + 2
    return int(value) if setting.annotation in (int, int | None) else float(value)


def test_every_live_setting_is_an_api_parameter_a_running_version_reads() -> None:
    live = [s for s in SETTINGS.values() if s.live]
    assert {s.name for s in live} >= {"batch_size", "max_batch_delay_ms", "sla_p99_ms"}
    for setting in live:
        assert setting.api is not None and API_NAMES[setting.api] == setting.name
        assert setting.serving, setting.name
    assert {s.name for s in live} == LIVE_SETTINGS  # what ModelVersion.configure takes
    # The scale API tunes each of them, by its API name.
    parsed = scale_params({s.api: "3" for s in live})
    assert parsed.tuning == {s.name: 3 for s in live} and parsed.min_worker is None


def test_every_setting_with_an_api_name_is_bounded_or_text() -> None:
    """Or a nested object whose own fields carry the bounds (responseCache)."""
    for name, setting in SETTINGS.items():
        if setting.api is not None:
            nested = isinstance(setting.annotation, type) and issubclass(
                setting.annotation, BaseModel
            )
            assert setting.bounded() or setting.annotation == str | None or nested, name
    with pytest.raises(BadRequest, match=r"sla_p99_ms: Input should be less than"):
        check_model_settings({"sla_p99_ms": 10**9, "handler": "h.py", "url": "x"})


def test_live_settings_come_from_every_serving_setting() -> None:
    values = {name: _off_default(s) for name, s in NUMERIC.items() if s.serving}
    settings = settings_from(ModelConfig.model_validate(values))
    assert {f.name for f in dataclasses.fields(ModelSettings)} == {
        *(name for name, s in SETTINGS.items() if s.serving),
        "restart_backoff_s",
        "max_response_size",
        "sequence_headers",
    }
    for name, value in values.items():
        assert getattr(settings, name) == value != SETTINGS[name].default, name


def test_register_parses_each_registered_setting_by_its_kind() -> None:
    # TorchServe's: junk or below the bound is the default; torchbay's own: junk is a 400.
    raw = {
        "url": "m.mar",
        "batch_size": "0",
        "max_batch_delay": "-1",
        "initial_workers": "x",
        "response_timeout": "0",
        "startup_timeout": "7",
        "max_queue_delay_ms": "2",
    }
    params = register_params(raw)
    assert (params.batch_size, params.max_batch_delay, params.initial_workers) == (None,) * 3
    assert (params.response_timeout, params.startup_timeout) == (None, 7.0)
    assert params.max_queue_delay_ms == 2.0
    assert set(REGISTERED) <= set(type(params).model_fields)
    with pytest.raises(BadRequest, match="sla_p99_ms: must be a finite number"):
        register_params({"url": "m.mar", "sla_p99_ms": "soon"})


def test_describe_shows_torchserves_settings_in_its_order() -> None:
    config = ModelConfig.model_validate({"deviceType": "cpu", "maxWorkerRssMb": 9})
    live = settings_from(config)
    assert list(described(SETTINGS, live, config, "batching")) == [
        "minWorkers",
        "maxWorkers",
        "batchSize",
        "maxBatchDelay",
        "responseTimeout",
        "startupTimeout",
        "maxRetryTimeoutInSec",
        "clientTimeoutInMills",
    ]
    assert described(SETTINGS, live, config, "device") == {"deviceType": "cpu", "deviceIds": None}
    assert described(SETTINGS, live, None, "device")["deviceType"] == "auto"  # no config: default
    assert described(SETTINGS, live, config, "workers") == {
        "maxRequestsPerWorker": 0,
        "maxWorkerRssMb": 9,
        "pinned": False,
        "responseCache": {"enable": False, "maxEntries": 1024, "maxBytes": 64 << 20},
    }


def test_the_load_message_is_the_launch_spec_by_field_name() -> None:
    spec = LaunchSpec(
        Path("/m"),
        "m",
        "1.0",
        handler="h.py",
        server_version="9",
        limit_max_image_pixels=False,
        max_request_size=77,
        batch_size=4,
        placement=Placement(gpu_id=2, threads=5, cpu_affinity=(1,)),
    )
    load = dataclasses.asdict(spec.load_message())
    facts = {**dataclasses.asdict(spec), **dataclasses.asdict(spec.placement)}
    facts["num_threads"] = facts.pop("threads")
    assert set(load) == {f.name for f in dataclasses.fields(p.Load)}
    wire = {"model_dir": "/m", "cpu_affinity": [1], "model_metrics": None}  # none: None
    wire["sequence_headers"] = list(spec.sequence_headers)  # a tuple travels as a list
    assert load == {**{k: facts[k] for k in load}, **wire}
    unpinned = dataclasses.replace(spec, placement=Placement(gpu_id=None, threads=1))
    assert unpinned.load_message().cpu_affinity is None


class _Wider(ModelConfig):
    """ModelConfig with one more setting, declared as any other is."""

    warmup_ms: Annotated[
        float,
        Setting("warmup_ms", True, torchserve=False, live=True, serving=True, describe="warmupMs"),
    ] = Field(5.0, ge=0, le=1000, alias="warmupMs")


def test_a_new_setting_reaches_the_api_the_live_settings_and_describe() -> None:
    settings = declared(_Wider)
    new = settings["warmup_ms"]
    assert (new.yaml_key, new.default, new.lower, new.annotation) == ("warmupMs", 5.0, 0, float)
    assert _Wider.model_validate({"warmupMs": 7}).warmup_ms == 7  # model-config.yaml's key
    assert api_names(settings)["warmup_ms"] == "warmup_ms"
    live_class = settings_class(settings)
    live = live_class().updated(warmup_ms=8.0)
    assert (live_class().warmup_ms, live.warmup_ms) == (5.0, 8.0)
    register = register_model({s.register_name: s for s in settings.values() if s.register})
    assert register.model_validate({"url": "m.mar", "warmup_ms": 3}).warmup_ms == 3
    with pytest.raises(ValidationError):  # the setting's own lower bound
        register.model_validate({"url": "m.mar", "warmup_ms": -1})
    assert described(settings, live, None, "workers")["warmupMs"] == 8.0
