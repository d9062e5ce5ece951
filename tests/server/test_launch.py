"""One launch spec per worker and one settings object per model version."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from torchbay.server.config.settings import ModelConfig, ServerConfig
from torchbay.server.serving.launch import LaunchSpec, Placement, settings_from
from torchbay.server.serving.model import ModelVersion


def test_the_load_message_and_the_spawn_come_from_one_spec() -> None:
    base = LaunchSpec(
        Path("/models/m"), "m", "2.0", handler="h.py", server_version="9", env={"A": "1"},
        log_format="json", limit_max_image_pixels=False,
    )  # fmt: skip
    spec = base.placed(Placement(gpu_id=1, threads=3, cpu_affinity=(4, 5, 6)), batch_size=8)
    load = spec.load_message()
    assert (load.model_dir, load.model_name, load.model_version) == ("/models/m", "m", "2.0")
    assert (load.gpu_id, load.num_threads, load.cpu_affinity) == (1, 3, [4, 5, 6])
    assert (load.batch_size, load.handler, load.server_version) == (8, "h.py", "9")
    assert load.limit_max_image_pixels is False
    worker = spec.new_worker()
    assert worker.load == load and worker.env == {"A": "1"} and worker.log_format == "json"
    assert worker.device == "cuda:1"
    assert base.placement == Placement(gpu_id=None, threads=1)  # the model's copy is untouched


def _version(config: ModelConfig) -> ModelVersion:
    return ModelVersion(
        name="m",
        version="1.0",
        model_dir=Path("."),
        settings=settings_from(config, ServerConfig(max_response_size=99)),
        config=config,
        place=lambda mv, i: Placement(gpu_id=None, threads=1),
    )


def test_live_changes_make_a_new_validated_config_and_its_settings() -> None:
    async def run() -> None:
        config = ModelConfig.model_validate({"batchSize": 2, "deviceType": "cpu"})
        mv = _version(config)
        mv.configure(batch_size=8, max_batch_delay_ms=5)
        await mv.scale(0, 2)
        assert mv.config is not config and config.batch_size == 2  # frozen: a new one
        assert (mv.config.batch_size, mv.config.max_batch_delay_ms) == (8, 5)
        assert (mv.config.min_workers, mv.config.max_workers) == (0, 2)
        assert mv.config.device_type == "cpu"
        s = mv.settings
        assert (s.batch_size, s.max_batch_delay_ms, s.min_workers, s.max_workers) == (8, 5, 0, 2)
        assert s.max_response_size == 99  # the server's part stays
        with pytest.raises(ValidationError):  # refused by ModelConfig, and nothing changed
            mv.configure(batch_size=10**9)
        assert mv.config.batch_size == 8 and mv.settings.batch_size == 8

    asyncio.run(run())
