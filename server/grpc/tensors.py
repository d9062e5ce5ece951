"""``ModelInferRequest`` <-> the Open Inference Protocol's binary tensor data extension.

ModelInfer reaches the worker as the HTTP/REST request Triton's binary extension defines
(``extension_binary_data.md``): the body is a JSON inference header of ``n`` bytes whose inputs
carry ``"parameters": {"binary_data_size": k}`` and no ``data``, followed by each input's raw
bytes in order; the ``inference-header-content-length: n`` header says where the JSON ends. Every
output is asked for as binary. The answer has the same layout; its outputs' raw bytes become
``raw_output_contents``. That is the only conversion: the frontend never decodes a tensor.

Typed ``contents`` are packed into the same little-endian raw layout the clients send in
``raw_input_contents`` (BYTES elements: a 4-byte little-endian length, then the bytes). An output
the worker answered as JSON ``data`` is packed the same way, so every response uses
``raw_output_contents`` (clients read those first).
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

from torchbay.server.errors import BadRequest, HandlerFailed
from torchbay.server.grpc.messages import message

HEADER_LENGTH = "inference-header-content-length"
CONTENT_TYPE = "application/octet-stream"
# datatype -> (InferTensorContents field, struct format of one element)
_TYPED = {
    "BOOL": ("bool_contents", "?"),
    "INT8": ("int_contents", "b"),
    "INT16": ("int_contents", "h"),
    "INT32": ("int_contents", "i"),
    "INT64": ("int64_contents", "q"),
    "UINT8": ("uint_contents", "B"),
    "UINT16": ("uint_contents", "H"),
    "UINT32": ("uint_contents", "I"),
    "UINT64": ("uint64_contents", "Q"),
    "FP32": ("fp32_contents", "f"),
    "FP64": ("fp64_contents", "d"),
    "BYTES": ("bytes_contents", ""),
}


def parameters_json(params: Any) -> dict[str, Any]:
    """A proto map of one-of values (``map<string, InferParameter>``, a repository request's
    ``parameters``, LogSettings' ``settings``) as a JSON object; an entry with no value set is
    left out."""
    out: dict[str, Any] = {}
    for key, param in params.items():
        which = param.WhichOneof("parameter_choice")
        if which is not None:
            out[key] = getattr(param, which)
    return out


def fill_parameters(target: Any, values: Any) -> None:
    """A JSON object into a ``map<string, InferParameter>`` (bool, int, float, else text)."""
    if not isinstance(values, dict):
        return
    for key, value in values.items():
        param = target[str(key)]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int) and -(1 << 63) <= value < (1 << 63):
            param.int64_param = value
        elif isinstance(value, float):
            param.double_param = value
        else:
            param.string_param = value if isinstance(value, str) else json.dumps(value)


def pack(datatype: str, values: list[Any], what: str) -> bytes:
    """Typed values in the raw layout; BadRequest naming ``what`` when they do not fit."""
    if datatype == "BYTES":
        chunks = []
        for v in values:
            data = v if isinstance(v, bytes) else str(v).encode()
            chunks += (struct.pack("<I", len(data)), data)
        return b"".join(chunks)
    if datatype not in _TYPED:
        raise BadRequest(f"{what}: datatype {datatype!r} has no typed contents; send it raw")
    fmt = _TYPED[datatype][1]
    try:
        return struct.pack(f"<{len(values)}{fmt}", *values)
    except (struct.error, TypeError, OverflowError) as exc:
        raise BadRequest(f"{what}: values do not fit datatype {datatype}: {exc}") from None


def in_shm(tensor: Any) -> bool:
    """Whether a request's input or output sits in a shared-memory region (its parameters
    name one): its bytes are neither in the message nor in the body (``plane/shm.py``)."""
    return "shared_memory_region" in tensor.parameters


# A tensor's shared-memory parameters and the InferParameter field each must use (Triton's).
_SHM_PARAMETERS = (
    ("shared_memory_region", "string_param"),
    ("shared_memory_offset", "int64_param"),
    ("shared_memory_byte_size", "int64_param"),
)


def check_shm_parameters(tensor: Any) -> None:
    """A request's input or output whose shared-memory parameters do not go together (a size or
    an offset without a region, a region without a size) or are of the wrong type: Triton's
    400s, in its words (``grpc_utils.h`` ``ParseSharedMemoryParams``)."""
    params, name = tensor.parameters, tensor.name
    for key, kind in _SHM_PARAMETERS:
        if key not in params:
            continue
        if key != "shared_memory_region" and "shared_memory_region" not in params:
            raise BadRequest(
                f"'{key}' can not be specified without 'shared_memory_region' parameter for "
                f"tensor '{name}'"
            )
        if params[key].WhichOneof("parameter_choice") != kind:
            raise BadRequest(
                f"invalid value type for '{key}' parameter for tensor '{name}', expected {kind}."
            )
    if "shared_memory_region" in params and "shared_memory_byte_size" not in params:
        raise BadRequest(
            "'shared_memory_byte_size' must be specified along with 'shared_memory_region' "
            f"parameter for tensor '{name}'"
        )


def _raw_inputs(request: Any) -> list[bytes]:
    """Each input's bytes in order (empty for one in shared memory): ``raw_input_contents``
    holds those of the other inputs, in order, as Triton's clients send them; without it, each
    input's typed ``contents``."""
    inputs, raw = request.inputs, list(request.raw_input_contents)
    shm = [in_shm(tensor) for tensor in inputs]
    if raw:
        # Triton checks the contents first: a request with both is refused for that, whatever
        # the count (its grpc_explicit_int_content_client.py sends one raw entry for two inputs)
        both = next((tensor for tensor in inputs if tensor.HasField("contents")), None)
        if both is not None:  # Triton's words
            raise BadRequest(
                f"contents field must not be specified when using raw_input_contents for "
                f"'{both.name}' for model '{request.model_name}'"
            )
        if len(raw) != shm.count(False):
            raise BadRequest(
                f"raw_input_contents has {len(raw)} entries for {shm.count(False)} inputs "
                "outside shared memory"
            )
        given = iter(raw)
        return [b"" if placed else next(given) for placed in shm]
    both = next(
        (t for t, placed in zip(inputs, shm, strict=True) if placed and t.HasField("contents")),
        None,
    )
    if both is not None:  # Triton's words: its values would be ignored for the region's
        raise BadRequest(
            f"unexpected 'content' provided when using shared memory for input tensor "
            f"'{both.name}' for model '{request.model_name}'"
        )
    return [b"" if placed else _typed(tensor) for tensor, placed in zip(inputs, shm, strict=True)]


def _typed(tensor: Any) -> bytes:
    """An input's typed ``contents`` packed; BadRequest naming the field when they are in
    another datatype's field or do not fill the shape (the worker sees only their bytes)."""
    what = f"input {tensor.name!r}"
    field = _TYPED.get(tensor.datatype, ("", ""))[0]
    if not field:
        raise BadRequest(f"{what}: datatype {tensor.datatype!r} needs raw_input_contents")
    values = list(getattr(tensor.contents, field))
    others = [f.name for f, _ in tensor.contents.ListFields() if f.name != field]
    if others:
        raise BadRequest(
            f"{what}: a {tensor.datatype} input's values go in contents.{field} (or "
            f"raw_input_contents), not contents.{others[0]}"
        )
    shape = list(tensor.shape)
    if all(d >= 0 for d in shape) and len(values) != math.prod(shape):
        raise BadRequest(
            f"{what}: shape {shape} holds {math.prod(shape)} values; contents.{field} has "
            f"{len(values)}"
        )
    return pack(tensor.datatype, values, what)


def request_body(request: Any) -> tuple[bytes, int]:
    """A ``ModelInferRequest`` as the binary-extension body; (body, JSON header length)."""
    for tensor in (*request.inputs, *request.outputs):
        check_shm_parameters(tensor)
    raw = _raw_inputs(request)
    params = parameters_json(request.parameters)
    params["binary_data_output"] = True
    header: dict[str, Any] = {"parameters": params}
    if request.id:
        header["id"] = request.id
    header["inputs"] = [
        {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
            "parameters": _tensor_parameters(tensor, {"binary_data_size": len(data)}),
        }
        for tensor, data in zip(request.inputs, raw, strict=True)
    ]
    if request.outputs:
        header["outputs"] = [
            {"name": out.name, "parameters": _tensor_parameters(out, {"binary_data": True})}
            for out in request.outputs
        ]
    head = json.dumps(header, separators=(",", ":")).encode()
    return head + b"".join(raw), len(head)


def _tensor_parameters(tensor: Any, binary: dict[str, Any]) -> dict[str, Any]:
    """A tensor's parameters as JSON, with ``binary`` unless it sits in shared memory."""
    params = parameters_json(tensor.parameters)
    return params if in_shm(tensor) else {**params, **binary}


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    for item in data:
        out.extend(_flatten(item))
    return out


def infer_response(body: bytes, headers: dict[str, str], model: str, version: str) -> Any:
    """The worker's (binary-extension or JSON) OIP answer as a ``ModelInferResponse``.
    HandlerFailed (INTERNAL) when it does not parse: a bug of ours or of the handler."""
    lowered = {k.lower(): v for k, v in headers.items()}
    try:
        head_len = int(lowered.get(HEADER_LENGTH, len(body)))
        if not 0 <= head_len <= len(body):
            raise ValueError(f"{HEADER_LENGTH} {head_len} past the body")
        header = json.loads(body[:head_len])
        return _build_response(header, memoryview(body)[head_len:], model, version)
    except (ValueError, TypeError, KeyError, AttributeError, BadRequest) as exc:
        raise HandlerFailed(f"The model's inference response is malformed: {exc}") from None


def _build_response(header: dict[str, Any], rest: memoryview, model: str, version: str) -> Any:
    response = message("inference.ModelInferResponse")()
    response.model_name = str(header.get("model_name") or model)
    response.model_version = str(header.get("model_version") or version)
    response.id = str(header.get("id") or "")
    fill_parameters(response.parameters, header.get("parameters") or {})
    offset = 0
    for out in header.get("outputs") or []:
        tensor = response.outputs.add()
        tensor.name, tensor.datatype = str(out["name"]), str(out["datatype"])
        tensor.shape.extend(int(d) for d in out.get("shape") or [])
        params = dict(out.get("parameters") or {})
        size = params.pop("binary_data_size", None)
        fill_parameters(tensor.parameters, params)
        if size is None:
            data = pack(tensor.datatype, _flatten(out.get("data", [])), f"output {tensor.name!r}")
        else:
            if not 0 <= int(size) <= len(rest) - offset:
                raise ValueError(f"output {tensor.name!r}: binary_data_size past the body")
            data = bytes(rest[offset : offset + int(size)])
            offset += int(size)
        response.raw_output_contents.append(data)
    return response
