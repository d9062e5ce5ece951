"""OIP model metadata from the signature the archiver records (a single- and a two-input model,
outputs from the traced run), model-config.yaml's override, an invalid override (400 on
register, a start-up failure naming the file and field), and ``GET /v2``'s extensions."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch
import tritonclient.http as triton_http
from torch import nn

from torchbay.archiver.package import ArchiveOptions, package
from torchbay.server.http.triton import OIP_EXTENSIONS

from .conftest import LiveServer, make_config

pytestmark = pytest.mark.slow

OVERRIDE_YAML = """\
batchSize: 2
inputs:
  - {name: pixels, datatype: FP32, shape: [-1, 8, 8]}
"""
BAD_YAML = """\
inputs:
  - {name: x, datatype: FLOAT, shape: [-1, 64]}
"""


class _TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 5)
        self.b = nn.Linear(3, 5)

    def forward(
        self, features: torch.Tensor, extra: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.a(features) + self.b(extra)
        return y, y.argmax(dim=1)


def build_oip_store(root: Path, work: Path) -> Path:
    """A model store, every archive built by our archiver with an example input:
    ``one`` (64 -> 10, tensor handler), ``two`` (inputs features [-1,64] and extra [-1,3],
    outputs FP32 [-1,5] and INT64 [-1]), ``over`` (``one`` with a model-config.yaml signature
    override) and ``badsig`` (``one`` with an invalid override)."""
    torch.manual_seed(0)
    one = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)).eval()
    torch.jit.save(torch.jit.script(one), str(work / "one.pt"))
    torch.jit.save(torch.jit.script(_TwoInputs().eval()), str(work / "two.pt"))
    torch.save(torch.randn(4, 64), work / "one_example.pt")
    # Keys out of forward's order: the archive takes forward's order.
    torch.save({"extra": torch.randn(4, 3), "features": torch.randn(4, 64)}, work / "two_ex.pt")
    (work / "over").mkdir()
    (work / "over" / "model-config.yaml").write_text(OVERRIDE_YAML)
    (work / "bad").mkdir()
    (work / "bad" / "model-config.yaml").write_text(BAD_YAML)
    specs = {
        "one": ("one.pt", "one_example.pt", None),
        "two": ("two.pt", "two_ex.pt", None),
        "over": ("one.pt", "one_example.pt", work / "over" / "model-config.yaml"),
        "badsig": ("one.pt", "one_example.pt", work / "bad" / "model-config.yaml"),
    }
    for name, (model, example, config) in specs.items():
        package(
            ArchiveOptions(model_name=name, version="1.0", handler="tensor",
                           serialized_file=work / model, example_input=work / example,
                           config_file=config, export_path=root)
        )  # fmt: skip
    return root


@pytest.fixture(scope="module")
def oip_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_oip_store(tmp_path_factory.mktemp("oip"), tmp_path_factory.mktemp("oip-work"))


@pytest.fixture(scope="module")
def server(oip_store: Path):
    live = LiveServer(
        make_config(oip_store, load_models=["one.mar", "two.mar", "over.mar"],
                    enable_model_api=True)
    ).start()  # fmt: skip
    yield live
    live.stop()


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
    }
    assert httpx.get(f"{server.url}/v2/models/one/versions/1.0").json() == body
    client = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
    try:
        assert client.get_model_metadata("one") == body
        assert client.get_model_metadata("one", model_version="1.0") == body
    finally:
        client.close()


def test_two_input_model_metadata(server: LiveServer) -> None:
    body = httpx.get(f"{server.url}/v2/models/two").json()
    assert body["inputs"] == [_spec("features", [-1, 64]), _spec("extra", [-1, 3])]
    assert body["outputs"] == [_spec("output0", [-1, 5]), _spec("output1", [-1], "INT64")]


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
    live = LiveServer(make_config(oip_store, load_models=["badsig.mar"])).start()
    try:
        failure = live.server.state.failed_models["badsig.mar"]
        assert "model-config.yaml" in failure and "inputs[0.datatype]" in failure
        assert live.server.registry.models == {}
    finally:
        live.stop()


def test_server_metadata_lists_the_extensions(server: LiveServer) -> None:
    body = httpx.get(f"{server.url}/v2").json()
    assert body["name"] == "torchbay"
    assert body["extensions"] == list(OIP_EXTENSIONS)
    assert {"statistics", "model_repository", "model_configuration"} <= set(body["extensions"])
