"""Build the models Triton's client examples call, as torch models archived by torchbay.

    python examples/triton/build_models.py [--out examples/triton/out]

Writes OUT/model_store/<name>.mar for each model of ``SPECS`` below; serve them with
``torchbay serve --model-store OUT/model_store --models all`` (README.md). Each archive's
model-config.yaml declares what Triton's config.pbtxt of the same model declares: tensor names,
datatypes, shapes (a leading -1 is the batch dimension: Triton's ``max_batch_size`` > 0, then
``batchSize``), an image input's ``format``, and ``index_to_name.json`` for class labels.
Nothing is downloaded: the classifiers have random weights from a fixed seed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from torchbay.handlers.testing import example_out, import_by_path, package_example

HERE = Path(__file__).resolve().parent


def model_module() -> Any:
    """This example's models.py, by path (the examples are not a package)."""
    return import_by_path(HERE / "models.py", "_torchbay_example_triton_models")


def tensor(name: str, datatype: str, shape: list[int], **more: str) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, **more}


def pair(prefix: str, datatype: str, shape: list[int]) -> list[dict[str, Any]]:
    return [tensor(f"{prefix}{i}", datatype, shape) for i in (0, 1)]


@dataclass
class Spec:
    """One model: its handler, its model (``None``: a handler alone), model-config.yaml."""

    handler: str
    model: str | None
    config: dict[str, Any]
    labels: int = 0  # > 0: an index_to_name.json of that many classes
    model_args: dict[str, Any] = field(default_factory=dict)


def _simple(datatype: str, handler: str = "tensor") -> Spec:
    # Triton's simple / simple_int8 / simple_string: max_batch_size 8, dims [16]
    config = {
        "batchSize": 8,
        "maxBatchDelay": 5,
        "inputs": pair("INPUT", datatype, [-1, 16]),
        "outputs": pair("OUTPUT", datatype, [-1, 16]),
    }
    return Spec(handler, "AddSub", config)


def _control(name: str, kind: str) -> dict[str, Any]:
    """A Triton ``sequence_batching.control_input`` entry: an INT32 flag, 0 false, 1 true."""
    return {"name": name, "control": [{"kind": kind, "int32_false_true": [0, 1]}]}


SPECS: dict[str, Spec] = {
    "simple": _simple("INT32"),
    "simple_int8": _simple("INT8"),
    "simple_string": _simple("BYTES", "bytes_handler.py"),
    # a Python-backend identity of strings of any length, max_batch_size 8
    "simple_identity": Spec(
        "bytes_handler.py",
        None,
        {
            "batchSize": 8,
            "inputs": [tensor("INPUT0", "BYTES", [-1, -1])],
            "outputs": [tensor("OUTPUT0", "BYTES", [-1, -1])],
        },
    ),
    # Triton's qa identity model (memory_growth_test.py's): max_batch_size 1024 there, 8 here
    "custom_identity_int32": Spec(
        "tensor",
        "Identity",
        {
            "batchSize": 8,
            "inputs": [tensor("INPUT0", "INT32", [-1, -1])],
            "outputs": [tensor("OUTPUT0", "INT32", [-1, -1])],
        },
    ),
    # Triton's simple_sequence (max_batch_size 8) on 2 workers: a sequence model whose START
    # and READY control inputs the server fills (docs/sequences.md)
    "simple_sequence": Spec(
        "tensor",
        "SimpleSequence",
        {
            "minWorkers": 2,
            "batchSize": 8,
            "maxBatchDelay": 5,
            "sequenceBatching": True,
            "sequenceMaxIdleMSec": 10000,
            "maxSequenceJobQueueSize": 16,  # a streaming client sends a whole sequence at once
            "inputs": [tensor(n, "INT32", [-1, 1]) for n in ("INPUT", "START", "READY")],
            "outputs": [tensor("OUTPUT", "INT32", [-1, 1])],
            "sequence_batching": {
                "control_input": [
                    _control("START", "CONTROL_SEQUENCE_START"),
                    _control("READY", "CONTROL_SEQUENCE_READY"),
                ]
            },
        },
    ),
    # decoupled: one response per element of IN; no batch dimension (max_batch_size 0)
    "repeat_int32": Spec(
        "repeat_handler.py",
        None,
        {
            "inputs": [
                tensor("IN", "INT32", [-1]),
                tensor("DELAY", "UINT32", [-1]),
                tensor("WAIT", "UINT32", [1]),
            ],
            "outputs": [tensor("OUT", "INT32", [1]), tensor("IDX", "UINT32", [1])],
        },
    ),
    # image_client.py's classifiers: densenet_onnx takes one NCHW image (max_batch_size 0),
    # inception_graphdef a batch of NHWC images (max_batch_size 8 here)
    "densenet_onnx": Spec(
        "tensor",
        "TinyClassifier",
        {
            "inputs": [tensor("data_0", "FP32", [3, 224, 224], format="FORMAT_NCHW")],
            "outputs": [tensor("fc6_1", "FP32", [1000])],
        },
        labels=1000,
        model_args={"classes": 1000, "channels_last": False},
    ),
    "inception_graphdef": Spec(
        "tensor",
        "TinyClassifier",
        {
            "batchSize": 8,
            "maxBatchDelay": 5,
            "inputs": [tensor("input", "FP32", [-1, 299, 299, 3], format="FORMAT_NHWC")],
            "outputs": [tensor("InceptionV3/Predictions/Softmax", "FP32", [-1, 1001])],
        },
        labels=1001,
        model_args={"classes": 1001, "channels_last": True},
    ),
    # Triton's ensemble of image preprocessing and inception_graphdef, as one handler
    "preprocess_inception_ensemble": Spec(
        "image_bytes_handler.py",
        "TinyClassifier",
        {
            "batchSize": 8,
            "inputs": [tensor("INPUT", "BYTES", [-1, 1])],
            "outputs": [tensor("OUTPUT", "FP32", [-1, 1001])],
        },
        labels=1001,
        model_args={"classes": 1001, "channels_last": True},
    ),
}


def labels(count: int) -> dict[int, str]:
    """Class names for a classifier of ``count`` classes (Triton's are ImageNet's: stand-ins)."""
    return {i: f"CLASS_{i:04d}" for i in range(count)}


def build_one(name: str, spec: Spec, work: Path, store: Path) -> Path:
    """Archive one model into ``store`` (its model-config.yaml and files under ``work/name``)."""
    import torch

    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    config_file = folder / "model-config.yaml"
    config_file.write_text(yaml.safe_dump(spec.config, sort_keys=False))
    options: dict[str, Any] = {"config_file": config_file}
    if spec.model is not None:
        torch.manual_seed(0)
        model = getattr(model_module(), spec.model)(**spec.model_args).eval()
        options["serialized_file"] = folder / "model.pt"
        torch.jit.save(torch.jit.script(model), str(options["serialized_file"]))
    if spec.labels:
        mapping = folder / "index_to_name.json"
        mapping.write_text(json.dumps(labels(spec.labels)))
        options["extra_files"] = (str(mapping),)
    handler = spec.handler if spec.handler == "tensor" else str(HERE / spec.handler)
    return package_example(store, model_name=name, handler=handler, **options)


def build(out: Path) -> Path:
    """Build every model of ``SPECS`` into ``out/model_store``; returns that folder."""
    store = out / "model_store"
    store.mkdir(parents=True, exist_ok=True)
    for name, spec in SPECS.items():
        build_one(name, spec, out / "work", store)
    return store


if __name__ == "__main__":
    store = build(example_out(__doc__, HERE / "out"))
    print(f"wrote {len(SPECS)} archives to {store}")
