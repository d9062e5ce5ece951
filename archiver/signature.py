"""A model's tensor signature: the name, Open Inference Protocol datatype and shape of each input
and output.

Torch-free: the server and the worker both import it. The archiver records the signature at packing
time (``torchbay.inputs`` / ``torchbay.outputs`` in ``MAR-INF/MANIFEST.json``, from the example
input and a traced run); an archive's ``model-config.yaml`` may override either list with the same
shape of entries::

    inputs:
      - {name: input0, datatype: FP32, shape: [-1, 64]}
    outputs:
      - {name: output0, datatype: FP32, shape: [-1, 10]}

``-1`` is a dynamic dimension (the batch dimension always is; a model whose inputs do not all
start with one has no batch dimension, ``Signature.batched``). ``model_signature`` merges the two
sources; the server serves the result as the model's OIP metadata and the worker checks every OIP
request against it (a missing, unknown, wrong-datatype or wrong-shape tensor is a 400).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
)

from .signature_sources import describes_tensors

# The OIP tensor datatypes (KServe v2 / Triton).
Datatype = Literal[
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BF16",
    "BYTES",
]
DATATYPES: frozenset[str] = frozenset(Datatype.__args__)  # type: ignore[attr-defined]

# torch dtype names (``str(torch.float32).removeprefix("torch.")``) to OIP datatypes.
TORCH_TO_OIP: dict[str, str] = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
    "bfloat16": "BF16",
}
OIP_TO_TORCH: dict[str, str] = {v: k for k, v in TORCH_TO_OIP.items()}

MAX_TENSORS = 256
MAX_RANK = 32
MAX_NAME_LEN = 256


class SignatureError(ValueError):
    """A signature in a manifest or model-config.yaml that is not valid; the message says where."""


class TensorSpec(BaseModel):
    """One tensor: ``{"name": "input0", "datatype": "FP32", "shape": [-1, 64]}``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=MAX_NAME_LEN)
    datatype: Datatype
    shape: list[int] = Field(max_length=MAX_RANK)
    # Triton's image layout of an input (model-config.yaml ``format``; its model configuration
    # carries it, and Triton's image_client reads it). None: not declared.
    format: Literal["FORMAT_NONE", "FORMAT_NCHW", "FORMAT_NHWC"] | None = None

    @field_validator("shape")
    @classmethod
    def _check_shape(cls, shape: list[int]) -> list[int]:
        if any(d < -1 for d in shape):
            raise ValueError("dimensions are non-negative, or -1 for a dynamic one")
        return shape

    @model_serializer(mode="wrap")
    def _without_undeclared_format(self, handler: Any) -> Any:
        """No ``format`` key unless one was declared: recorded manifests stay as they were."""
        data = handler(self)
        if isinstance(data, dict) and data.get("format") is None:
            data.pop("format", None)
        return data

    def matches_shape(self, shape: Sequence[int]) -> bool:
        """True when a concrete ``shape`` fits this spec (-1 matches any size)."""
        return len(shape) == len(self.shape) and all(
            want in (-1, got) for want, got in zip(self.shape, shape, strict=True)
        )


class Signature(BaseModel):
    """A model's inputs and outputs, in the model's positional order; names are unique."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    inputs: list[TensorSpec] = Field(default_factory=list, max_length=MAX_TENSORS)
    outputs: list[TensorSpec] = Field(default_factory=list, max_length=MAX_TENSORS)
    # The input names are the archiver's (input0, input1, ... from a tensor or tuple example),
    # never declared by the user: a request's inputs may then be matched by position.
    inputs_by_position: bool = False

    @field_validator("inputs", "outputs")
    @classmethod
    def _unique_names(cls, specs: list[TensorSpec]) -> list[TensorSpec]:
        names = [s.name for s in specs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"tensor names must be unique; repeated: {dupes}")
        return specs

    @property
    def batched(self) -> bool:
        """Whether every input has a batch dimension first (-1): requests are then concatenated
        along it. Without one (Triton's ``max_batch_size: 0``) a request's tensors are the whole
        inputs, and each request runs alone."""
        return all(s.shape[:1] == [-1] for s in self.inputs)

    def input(self, name: str) -> TensorSpec | None:
        return next((s for s in self.inputs if s.name == name), None)

    def output(self, name: str) -> TensorSpec | None:
        return next((s for s in self.outputs if s.name == name), None)

    def to_json(self) -> dict[str, list[dict[str, Any]]]:
        """The OIP metadata fields: ``{"inputs": [...], "outputs": [...]}``."""
        return {
            "inputs": [s.model_dump(exclude={"format"}) for s in self.inputs],
            "outputs": [s.model_dump(exclude={"format"}) for s in self.outputs],
        }


def parse_specs(value: Any, where: str) -> list[TensorSpec]:
    """A list of tensor specs from JSON/YAML data; SignatureError names ``where`` and the field."""
    if not isinstance(value, list):
        raise SignatureError(f"{where}: must be a list of {{name, datatype, shape}} objects")
    try:
        return Signature(inputs=value).inputs
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"][1:])
        raise SignatureError(f"{where}{'[' + loc + ']' if loc else ''}: {first['msg']}") from None


def model_signature(
    torchbay_info: Mapping[str, Any] | None, yaml_config: Mapping[str, Any] | None
) -> Signature | None:
    """The signature a model serves: model-config.yaml's ``inputs``/``outputs`` (each replaces the
    recorded list), over the manifest's ``torchbay.inputs``/``outputs``, over the legacy
    ``torchbay.input_shape``/``input_dtype`` (one input ``input0`` with a dynamic batch
    dimension). None when nothing describes the model. Raises SignatureError."""
    info = torchbay_info or {}
    yaml_config = yaml_config or {}
    if not describes_tensors(info, yaml_config):
        return None
    inputs = _recorded(info, "inputs")
    outputs = _recorded(info, "outputs")
    if inputs is None and info.get("input_shape"):
        dtype = TORCH_TO_OIP.get(str(info.get("input_dtype") or "float32"), "FP32")
        shape = [-1, *info["input_shape"]]
        inputs = parse_specs([{"name": "input0", "datatype": dtype, "shape": shape}], "manifest")
    if "inputs" in yaml_config:
        inputs = parse_specs(yaml_config["inputs"], "model-config.yaml inputs")
    if "outputs" in yaml_config:
        outputs = parse_specs(yaml_config["outputs"], "model-config.yaml outputs")
    if inputs is None and outputs is None:
        return None
    generated = "inputs" not in yaml_config and _generated_names(inputs or [])
    try:
        return Signature(inputs=inputs or [], outputs=outputs or [], inputs_by_position=generated)
    except ValidationError as exc:
        raise SignatureError(f"model signature: {exc.errors()[0]['msg']}") from None


def _generated_names(inputs: list[TensorSpec]) -> bool:
    """The names the archiver gives a tensor or tuple example input (and the legacy manifest's
    one input): ``input0``, ``input1``, ... in order. A dict example naming its inputs exactly
    so reads the same: matching by position then accepts what matching by name accepts too."""
    return bool(inputs) and [s.name for s in inputs] == [f"input{i}" for i in range(len(inputs))]


def _recorded(info: Mapping[str, Any], key: str) -> list[TensorSpec] | None:
    value = info.get(key)
    if value is None:
        return None
    return parse_specs(
        [s.model_dump() if isinstance(s, TensorSpec) else s for s in value], f"manifest {key}"
    )


__all__ = [
    "DATATYPES",
    "OIP_TO_TORCH",
    "TORCH_TO_OIP",
    "Signature",
    "SignatureError",
    "TensorSpec",
    "model_signature",
    "parse_specs",
]
