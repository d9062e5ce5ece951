"""How a real server takes the ways an operator declares devices, on any host: the GPUs the
server sees are fixed at the seam (``CUDA_VISIBLE_DEVICES=""`` hides every GPU without a probe;
``gpu_count`` stands for the detected GPUs), everything above it is the real code.

TorchServe 0.12's answers on a host without a GPU are tests/data/torchserve/devices/answers.json
(its README says how they were recorded): ``number_of_gpu`` never adds GPUs the host lacks, and a
``deviceType: gpu`` model runs on the CPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import LiveServer, make_config, tiny_archive

RECORD = Path(__file__).parents[1] / "data" / "torchserve" / "devices"
ANSWERS = json.loads((RECORD / "answers.json").read_text())
# Values that are no device type or no list of ids: TorchServe warns and ignores them; torchbay
# refuses them as it refuses every model-config.yaml value of the wrong kind (README, differences).
REFUSED = {
    "tpu": "device_type",
    "ids_words": "device_ids",
    "ids_scalar": "deviceIds must be a list",
}


@pytest.fixture(scope="module")
def device_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One archive per recorded case: the recorder's handler and the case's model-config.yaml."""
    root = tmp_path_factory.mktemp("devices")
    work = tmp_path_factory.mktemp("devices-build")
    for case in ANSWERS["cases"]:
        config = None
        if case["model_config"] is not None:
            config = work / f"{case['model']}.yaml"
            config.write_text(case["model_config"])
        handler = str(RECORD / "devices_handler.py")
        tiny_archive(work, root, case["model"], handler, config_file=config)
    return root


@pytest.fixture
def no_gpu_server(device_store: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU, whatever the host has
    config = make_config(device_store, enable_model_api=True, number_of_gpu=2)
    server = LiveServer(config, cores=2).start()
    yield server
    server.stop()


def register(server: LiveServer, name: str) -> httpx.Response:
    params = {"url": f"{name}.mar", "initial_workers": 1, "synchronous": "true"}
    return httpx.post(f"{server.management_url}/models", params=params, timeout=120)


def test_number_of_gpu_and_device_type_gpu_on_a_host_without_gpu(no_gpu_server: Any) -> None:
    assert no_gpu_server.server.gpu_count == 0  # number_of_gpu=2 caps, never adds
    for answer in ANSWERS["answers"]:
        name = answer["model"]
        registered = register(no_gpu_server, name)
        if name in REFUSED:
            assert registered.status_code == 400, registered.text
            assert REFUSED[name] in registered.json()["message"]
            continue
        assert registered.status_code == answer["register"], registered.text
        [described] = httpx.get(f"{no_gpu_server.management_url}/models/{name}", timeout=30).json()
        assert [w["gpu"] for w in described["workers"]] == answer["workers_gpu"], name
        assert {k: described[k] for k in answer["described"]} == answer["described"], name
        predicted = httpx.post(f"{no_gpu_server.url}/predictions/{name}", json={}, timeout=60)
        assert predicted.status_code == answer["predict"]
        assert predicted.json() == answer["handler_saw"], name


def placements(server: LiveServer, name: str) -> list[int | None]:
    registry = server.server.registry
    assert registry is not None
    versions = [mv for mv in registry.all_versions() if mv.name == name]
    return [slot.placement.gpu_id for mv in versions for slot in mv.slots]


def test_number_of_gpu_caps_the_visible_gpus(device_store: Path) -> None:
    # Two GPUs visible, number_of_gpu=1: every worker on GPU 0 (TorchServe: min of the two).
    config = make_config(
        device_store, load_models=["plain.mar"], number_of_gpu=1, default_workers_per_model=2
    )
    server = LiveServer(config, gpu_count=2, cores=2).start()
    try:
        assert server.server.gpu_count == 1
        assert placements(server, "plain") == [0, 0]
        [described] = httpx.get(f"{server.management_url}/models/plain", timeout=30).json()
        assert (described["deviceType"], described["deviceIds"]) == ("gpu", None)  # TorchServe's
    finally:
        server.stop()


def test_device_ids_start_again_at_the_first_after_registering_again(device_store: Path) -> None:
    # deviceIds [1, 0]: a per-model counter; a model registered again is a new model to
    # TorchServe (its counter at 0), so its first worker is on deviceIds[0] again.
    config = make_config(device_store, enable_model_api=True)
    server = LiveServer(config, gpu_count=2, cores=2).start()
    try:
        assert register(server, "ids_pair").status_code == 200
        assert placements(server, "ids_pair") == [1]
        gone = httpx.delete(f"{server.management_url}/models/ids_pair", timeout=60)
        assert gone.status_code == 200, gone.text
        assert register(server, "ids_pair").status_code == 200
        assert placements(server, "ids_pair") == [1]
        predicted = httpx.post(f"{server.url}/predictions/ids_pair", json={}, timeout=60)
        assert predicted.json()["gpu_id"] == 1  # what the handler's context says
    finally:
        server.stop()
