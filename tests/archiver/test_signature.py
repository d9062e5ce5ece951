"""archiver/signature.py: the model signature's sources and their precedence, and its errors."""

from __future__ import annotations

import pytest

from torchbay.archiver.manifest import TorchbayInfo
from torchbay.archiver.signature import SignatureError, TensorSpec, model_signature

RECORDED = {
    "format": "torchscript",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}],
}


def test_recorded_signature_round_trips_through_the_manifest() -> None:
    info = TorchbayInfo.model_validate(RECORDED)
    assert info.inputs == [TensorSpec(name="x", datatype="FP32", shape=[-1, 4])]
    sig = model_signature(info.model_dump(), None)
    assert sig is not None
    assert sig.to_json() == {"inputs": RECORDED["inputs"], "outputs": RECORDED["outputs"]}


def test_yaml_replaces_each_list_it_names() -> None:
    yaml_inputs = [
        {"name": "a", "datatype": "INT64", "shape": [-1, 3]},
        {"name": "b", "datatype": "BYTES", "shape": [-1]},
    ]
    sig = model_signature(RECORDED, {"inputs": yaml_inputs, "batchSize": 4})
    assert sig is not None
    assert [s.name for s in sig.inputs] == ["a", "b"]
    assert [s.name for s in sig.outputs] == ["y"]  # kept from the manifest
    assert sig.input("b") is not None and sig.input("x") is None


def test_legacy_input_shape_becomes_input0_with_a_dynamic_batch() -> None:
    sig = model_signature({"input_shape": [1, 8, 8], "input_dtype": "float16"}, None)
    assert sig is not None
    assert sig.inputs == [TensorSpec(name="input0", datatype="FP16", shape=[-1, 1, 8, 8])]
    assert sig.outputs == []
    assert model_signature({}, {}) is None and model_signature(None, None) is None


def test_matches_shape() -> None:
    spec = TensorSpec(name="x", datatype="FP32", shape=[-1, 4])
    assert spec.matches_shape([7, 4]) and spec.matches_shape((0, 4))
    assert not spec.matches_shape([7, 5]) and not spec.matches_shape([4])


@pytest.mark.parametrize(
    ("yaml_config", "fragment"),
    [
        ({"inputs": "x"}, "must be a list"),
        ({"inputs": [{"name": "x", "datatype": "FLOAT", "shape": [1]}]}, "inputs[0.datatype]"),
        ({"outputs": [{"name": "x", "datatype": "FP32", "shape": [-2]}]}, "outputs[0.shape]"),
        ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "dims": 1}]}, "dims"),
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}] * 2},
            "repeated: ['x']",
        ),
    ],
)
def test_invalid_signatures_name_the_field(yaml_config: dict, fragment: str) -> None:
    with pytest.raises(SignatureError, match=r"model-config\.yaml") as err:
        model_signature(None, yaml_config)
    assert fragment in str(err.value)
