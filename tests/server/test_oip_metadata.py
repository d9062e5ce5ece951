"""OIP model metadata from the signature the archiver records (a single- and a two-input model,
outputs from the traced run), model-config.yaml's override, an invalid override (400 on
register, a start-up failure naming the file and field), and ``GET /v2``'s extensions."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tritonclient.http as triton_http

from .conftest import LiveServer, running

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(oip_store: Path) -> Iterator[LiveServer]:
    models = ["one.mar", "two.mar", "over.mar", "image.mar", "flat.mar"]
    with running(oip_store, load_models=models, enable_model_api=True) as live:
        yield live


def _spec(name: str, shape: list[int], datatype: str = "FP32") -> dict:
    return {"name": name, "datatype": datatype, "shape": shape}


def test_single_input_model_metadata(server: LiveServer) -> None:
    body = httpx.get(f"{server.url}/v2/models/one").json()
    assert body == {
        "name": "one",
        "versions": ["1.0"],
        "platform": "pytorch_torchscript",
        "inputs": [_spec("input0", [-1, 64])],
        "outputs": [_spec("output0", [-1, 10])],
        "parameters": {"inputs_by_position": True},  # input0 is the archiver's name
    }
    assert httpx.get(f"{server.url}/v2/models/one/versions/1.0").json() == body
    client = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
    try:
        assert client.get_model_metadata("one") == body
        assert client.get_model_metadata("one", model_version="1.0") == body
    finally:
        client.close()


def test_a_request_may_name_an_input_the_archiver_named_otherwise(server: LiveServer) -> None:
    """``one`` was archived from a single-tensor example: its input's name (``input0``) is the
    archiver's, so ``input-0`` (KServe's TorchServe examples) is taken by position; ``two``
    declared its names (a dict example): another name is a 400 naming it."""
    row = {"shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}
    ok = httpx.post(
        f"{server.url}/v2/models/one/infer", json={"inputs": [{"name": "input-0", **row}]}
    )
    assert ok.status_code == 200, ok.text
    assert ok.json()["outputs"][0]["shape"] == [1, 10]
    extra = {"name": "extra", "shape": [1, 3], "datatype": "FP32", "data": [0.0] * 3}
    body = {"inputs": [{"name": "input-0", **row}, extra]}
    refused = httpx.post(f"{server.url}/v2/models/two/infer", json=body)
    assert refused.status_code == 400 and "unknown input 'input-0'" in refused.json()["error"]
    assert "parameters" not in httpx.get(f"{server.url}/v2/models/two").json()


def test_two_input_model_metadata(server: LiveServer) -> None:
    body = httpx.get(f"{server.url}/v2/models/two").json()
    assert body["inputs"] == [_spec("features", [-1, 64]), _spec("extra", [-1, 3])]
    assert body["outputs"] == [_spec("output0", [-1, 5]), _spec("output1", [-1], "INT64")]


def test_the_model_configuration_carries_the_declared_format_and_the_batch_dimension(
    server: LiveServer,
) -> None:
    """As Triton's: an input's declared ``format`` (Triton's image_client reads it), and
    ``max_batch_size`` 0 with whole shapes for a model whose inputs have no batch dimension."""
    client = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
    try:
        image = client.get_model_config("image")
        assert image["input"] == [
            {"name": "image", "data_type": "TYPE_FP32", "dims": [1, 8, 8], "format": "FORMAT_NCHW"}
        ]
        assert image["max_batch_size"] == 1
        flat = client.get_model_config("flat")
        assert flat["max_batch_size"] == 0
        assert flat["input"] == [{"name": "features", "data_type": "TYPE_FP32", "dims": [64]}]
        assert flat["output"][0]["dims"] == [-1, 10]  # the whole shape, batch included
    finally:
        client.close()
    # OIP's metadata has no format field: the tensor stays {name, datatype, shape}
    assert httpx.get(f"{server.url}/v2/models/image").json()["inputs"] == [
        _spec("image", [-1, 1, 8, 8])
    ]


def test_model_config_yaml_overrides_the_recorded_inputs(server: LiveServer) -> None:
    body = httpx.get(f"{server.url}/v2/models/over").json()
    assert body["inputs"] == [_spec("pixels", [-1, 8, 8])]  # the yaml's
    assert body["outputs"] == [_spec("output0", [-1, 10])]  # still the recorded ones


def test_an_invalid_signature_is_a_400_on_register_naming_file_and_field(
    server: LiveServer,
) -> None:
    response = httpx.post(f"{server.management_url}/models", params={"url": "badsig.mar"})
    assert response.status_code == 400, response.text
    message = response.json()["message"]
    assert "model-config.yaml" in message and "inputs[0.datatype]" in message
    assert "/" not in message.replace("model-config.yaml", "")  # no filesystem path
    assert "badsig" not in server.server.registry.models  # nothing registered
    # Metadata of an unknown model: OIP's error shape.
    missing = httpx.get(f"{server.url}/v2/models/badsig")
    assert missing.status_code == 404 and set(missing.json()) == {"error"}


def test_an_invalid_signature_fails_the_start_up_load_clearly(oip_store: Path) -> None:
    with running(oip_store, load_models=["badsig.mar"]) as live:
        failure = live.server.state.failed_models["badsig.mar"]
        assert "model-config.yaml" in failure and "inputs[0.datatype]" in failure
        assert live.server.registry.models == {}


def test_server_metadata_lists_the_extensions(server: LiveServer) -> None:
    body = httpx.get(f"{server.url}/v2").json()
    assert body["name"] == "torchbay"
    assert body["extensions"] == [
        "binary_tensor_data",
        "classification",
        "sequence",  # OIP's sequence_id/start/end parameters: it was served but not listed
        "schedule_policy",
        "model_configuration",
        "model_repository",
        "statistics",
        "logging",
        "trace",
    ]
