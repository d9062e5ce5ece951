"""Open Inference Protocol (KServe v2 / Triton) inference requests, as the worker reads them.

Torch-free. ``parse_request`` undoes the body's Content-Encoding, splits off the binary tensor
data (``Inference-Header-Content-Length``), validates the JSON header and gives every input an
``"array"`` (numpy, shaped; see ``oip_binary``). ``check_signature`` matches the inputs BY NAME
against the model's signature (400 on a missing, unknown, wrong-datatype or wrong-shape tensor,
or an unknown requested output; an FP32 input where the model declares FP16 or BF16 is cast to
it) and puts them in the signature's order, the order the model takes them in. A model without a
signature takes its inputs in the request's order.

Every input keeps the request's fields (``name``, ``shape``, ``datatype``, ``parameters``, and
``data`` when it was sent as JSON); handlers that speak v2 natively read ``"array"``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import BadInput
from . import oip_binary, shm
from .envelopes import V2_DATATYPES, decode_json
from .oip_encoding import DEFAULT_MAX_SIZE, decode_content

HEADER_LENGTH = "inference-header-content-length"
MAX_RANK = 32  # as a signature's (archiver.signature.MAX_RANK); numpy allows 64
MAX_ELEMENTS = 1 << 56  # of 8 bytes each: within numpy's index range, past any real tensor


def parse_request(
    body: bytes,
    headers: Mapping[str, str],
    max_size: int = DEFAULT_MAX_SIZE,
    regions: shm.Table | None = None,
    model: str = "",
) -> dict[str, Any]:
    """The validated request with an ``"array"`` per input; raises BadInput (413 for a body that
    inflates past ``max_size``). ``regions``: the registered shared-memory regions that inputs
    and outputs may name (``shm.py``); an output placed in one gets its ``shm.SLOT``. ``model``:
    the name Triton's messages give."""
    body = decode_content(body, headers.get("content-encoding"), max_size)
    header_len = _header_length(headers.get(HEADER_LENGTH), len(body))
    view = memoryview(body)
    request = decode_json(bytes(view[:header_len]) if header_len is not None else body)
    _check_envelope(request)
    shm.release_unnamed(regions)
    binary = view[header_len:] if header_len is not None else view[:0]
    offset, names = 0, set()
    for i, tensor in enumerate(request["inputs"]):
        offset = _decode_input(tensor, i, binary, offset, header_len is not None, regions, model)
        if tensor["name"] in names:  # as Triton, whatever the model declares
            raise BadInput(f"input {tensor['name']!r} is given twice")
        names.add(tensor["name"])
    if offset != len(binary):
        raise BadInput(
            f"the binary tensor data is {len(binary)} bytes but the inputs' binary_data_size "
            f"add up to {offset}"
        )
    for output in request.get("outputs") or ():
        shm.check_output(regions, output)
    return request


def _header_length(value: str | None, body_len: int) -> int | None:
    if value is None:
        return None
    try:
        length = int(value.strip())
    except ValueError:
        length = -1
    if not 0 < length <= body_len:
        raise BadInput(
            f"Inference-Header-Content-Length {value!r} is not a length within the "
            f"{body_len}-byte body"
        )
    return length


def _check_envelope(request: Any) -> None:
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise BadInput("v2 request must be a JSON object with an 'inputs' list")
    if not request["inputs"]:
        raise BadInput("v2 request has no inputs")
    if "id" in request and not isinstance(request["id"], str):
        raise BadInput("v2 field 'id' must be a string")
    check_parameters(request, "v2 request")
    _check_flag(request, "binary_data_output")
    outputs = request.get("outputs")
    if outputs is None:
        return
    if not isinstance(outputs, list):
        raise BadInput("v2 field 'outputs' must be a list of objects with a string 'name'")
    seen: set[str] = set()
    for i, output in enumerate(outputs):
        if not isinstance(output, dict) or not isinstance(output.get("name"), str):
            raise BadInput(f"v2 field 'outputs[{i}].name' must be a string")
        if output["name"] in seen:
            raise BadInput(f"v2 output {output['name']!r} is requested twice")
        seen.add(output["name"])
        check_parameters(output, f"v2 output {output['name']!r}")
        _check_flag(output, "binary_data")
        classes = parameters(output).get("classification")
        if classes is not None and (type(classes) is not int or classes < 1):
            raise BadInput(f"v2 output {output['name']!r}: classification must be an integer >= 1")


def check_parameters(obj: dict[str, Any], where: str) -> None:
    if "parameters" in obj and not isinstance(obj["parameters"], (dict, type(None))):
        raise BadInput(f"{where}: field 'parameters' must be an object")


def _check_flag(obj: dict[str, Any], name: str) -> None:
    """A boolean parameter is true or false: anything else is Triton's 400, not ignored."""
    params = parameters(obj)
    if name in params and not isinstance(params[name], bool):
        raise BadInput(f"Unable to parse '{name}': it must be true or false")


def parameters(obj: Mapping[str, Any]) -> dict[str, Any]:
    return obj.get("parameters") or {}


def _decode_input(
    tensor: Any,
    i: int,
    binary: memoryview,
    offset: int,
    has_header: bool,
    regions: shm.Table | None = None,
    model: str = "",
) -> int:
    """Add ``tensor["array"]``; returns the offset of the next input's binary data."""
    name, datatype, shape = _check_fields(tensor, i)
    if shm.placed(parameters(tensor)):
        tensor["array"] = shm.read_input(regions, tensor, "data" in tensor, model)
        return offset
    size = parameters(tensor).get("binary_data_size")
    if size is None:
        if "data" not in tensor:
            raise BadInput(f"v2 input {name!r} has neither 'data' nor a binary_data_size")
        data = tensor["data"]
        if not isinstance(data, (list, str, int, float, bool)):
            raise BadInput(f"v2 field 'inputs[{i}].data' of {name!r} must be a list or a scalar")
        tensor["array"] = oip_binary.from_json(data, datatype, shape, name)
        return offset
    if "data" in tensor:
        raise BadInput(f"v2 input {name!r} has both 'data' and a binary_data_size")
    if not has_header:
        raise BadInput(
            f"v2 input {name!r} has a binary_data_size but the request has no "
            "Inference-Header-Content-Length header"
        )
    if type(size) is not int or size < 0:
        raise BadInput(f"v2 input {name!r}: binary_data_size must be a non-negative integer")
    if offset + size > len(binary):
        raise BadInput(
            f"v2 input {name!r}: binary_data_size {size} runs past the end of the body "
            f"({len(binary) - offset} bytes left)"
        )
    array = oip_binary.from_binary(binary[offset : offset + size], datatype, shape, name, model)
    tensor["array"] = array
    return offset + size


def _check_fields(tensor: Any, i: int) -> tuple[str, str, list[int]]:
    if not isinstance(tensor, dict):
        raise BadInput(f"v2 input {i} is not an object")
    missing = [k for k in ("name", "shape", "datatype") if k not in tensor]
    if missing:
        raise BadInput(f"v2 input {i} lacks {missing}")
    name = tensor["name"]
    if not isinstance(name, str):
        raise BadInput(f"v2 field 'inputs[{i}].name' must be a string")
    datatype = tensor["datatype"]
    if not isinstance(datatype, str) or datatype not in V2_DATATYPES:
        raise BadInput(
            f"v2 field 'inputs[{i}].datatype' of {name!r} must be one of {sorted(V2_DATATYPES)}"
        )
    shape = tensor["shape"]
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise BadInput(
            f"v2 field 'inputs[{i}].shape' of {name!r} must be a list of non-negative integers"
        )
    if len(shape) > MAX_RANK:
        raise BadInput(f"v2 input {name!r}: shape has {len(shape)} dimensions (at most {MAX_RANK})")
    if math.prod(d for d in shape if d) > MAX_ELEMENTS:  # numpy refuses it, even with a 0
        raise BadInput(f"v2 input {name!r}: shape {shape} is larger than a tensor can be")
    check_parameters(tensor, f"v2 input {name!r}")
    return name, datatype, shape


def check_signature(
    request: dict[str, Any], signature: Any, max_batch: int = 0, model: str = ""
) -> None:
    """Match ``request``'s inputs by name against ``signature`` (an archiver ``Signature``) and
    reorder them to its order; check requested output names and, for a model whose inputs have
    a batch dimension, that they agree on it and it is at most ``max_batch`` (0: any; Triton's
    max_batch_size, as ``WireRequest.max_batch`` carries it). Raises BadInput."""
    if signature is None:
        return
    if signature.inputs:
        request["inputs"] = _matched_inputs(request["inputs"], signature)
        if signature.batched:
            _check_batch(request["inputs"], max_batch, model)
    if signature.outputs:
        known = [s.name for s in signature.outputs]
        for output in request.get("outputs") or []:
            if output["name"] not in known:
                name = output["name"]
                raise BadInput(f"unknown output {name!r}; the model's outputs are {known}")


def _check_batch(inputs: list[dict[str, Any]], max_batch: int, model: str) -> None:
    """Triton's rules, in its words: a request's inputs have one batch size (their first
    dimension: the handler concatenates requests along it and splits the outputs by it), at
    most the model's max_batch_size."""
    batch = inputs[0]["shape"][:1]
    for tensor in inputs[1:]:
        if tensor["shape"][:1] != batch:
            raise BadInput(
                f"input '{tensor['name']}' batch size does not match other inputs for '{model}'"
            )
    if max_batch and batch and batch[0] > max_batch:
        raise BadInput(f"inference request batch-size must be <= {max_batch} for '{model}'")


def _matched_inputs(inputs: list[dict[str, Any]], signature: Any) -> list[dict[str, Any]]:
    known = [s.name for s in signature.inputs]
    if _by_position(inputs, signature, known):
        inputs = [{**t, "name": s.name} for t, s in zip(inputs, signature.inputs, strict=True)]
    by_name: dict[str, dict[str, Any]] = {}
    for tensor in inputs:
        name = tensor["name"]
        if name not in known:
            raise BadInput(f"unknown input {name!r}; the model's inputs are {known}")
        if name in by_name:
            raise BadInput(f"input {name!r} is given twice")
        by_name[name] = tensor
    ordered = []
    for spec in signature.inputs:
        tensor = by_name.get(spec.name)
        if tensor is None:
            raise BadInput(
                f"missing input {spec.name!r} ({spec.datatype}, shape {spec.shape}); "
                f"the model's inputs are {known}"
            )
        tensor = _as_declared(tensor, spec)
        if not spec.matches_shape(tensor["shape"]):
            raise BadInput(
                f"input {spec.name!r} has shape {tensor['shape']}; the model expects "
                f"{spec.shape} (-1: any size)"
            )
        ordered.append(tensor)
    return ordered


def _as_declared(tensor: dict[str, Any], spec: Any) -> dict[str, Any]:
    """``tensor`` in the datatype ``spec`` declares. A half-precision input (an fp16 or bf16
    archive's) also takes FP32, cast here once for every handler, so that clients which always
    send FP32 keep working; Triton refuses any mismatch, and so does every other pair here."""
    given, declared = tensor["datatype"], spec.datatype
    if given == declared:
        return tensor
    if given != "FP32" or declared not in oip_binary.HALF:
        also = " (or FP32, cast to it)" if declared in oip_binary.HALF else ""
        raise BadInput(
            f"input {spec.name!r} has datatype {given}; the model expects {declared}{also}"
        )
    array = tensor["array"]
    if isinstance(array, np.ndarray):
        return {**tensor, "datatype": declared, "array": oip_binary.to_half(array, declared)}
    from . import cuda_shm  # a tensor on the GPU (CUDA shared memory): cast there

    return {**tensor, "datatype": declared, "array": cuda_shm.cast(array, declared)}


def _by_position(inputs: list[dict[str, Any]], signature: Any, known: list[str]) -> bool:
    """Match the request's inputs by position: the model's input names were made up by the
    archiver (never declared by the user, ``Signature.inputs_by_position``), the request names
    one the model does not have (``input-0``, KServe's TorchServe examples' name), and it gives
    as many inputs as the model takes. Declared names are a contract: never by position."""
    return (
        bool(getattr(signature, "inputs_by_position", False))
        and len(inputs) == len(known)
        and any(t["name"] not in known for t in inputs)
    )


def body_value(request: dict[str, Any]) -> Any:
    """What a handler that does not speak v2 sees as ``body``: each input's data (nested lists,
    a BYTES element alone unwrapped), the first input's alone when there is one."""
    values = [_value(tensor) for tensor in request["inputs"]]
    return values[0] if len(values) == 1 else values


def _value(tensor: dict[str, Any]) -> Any:
    array = tensor["array"]
    if tensor["datatype"] == "BYTES":
        if array.size == 1:
            return array.reshape(-1)[0]
        return tensor["data"] if "data" in tensor else array.tolist()
    if "data" in tensor:
        return tensor["data"]
    if tensor["datatype"] == "BF16":
        if not isinstance(array, np.ndarray):  # a tensor on the GPU (CUDA shared memory)
            return array.float().tolist()
        return oip_binary.bf16_floats(array).reshape(array.shape).tolist()
    return array.tolist()
