"""Open Inference Protocol inference responses: requested outputs, classification, JSON or binary.

Torch-free. ``encode`` takes a handler's outputs (each ``{"name", "datatype", "shape"}`` plus a
numpy ``"array"`` or a JSON ``"data"`` list), keeps the requested ones in the requested order (an
unknown name is a 400), applies each output's ``classification`` parameter (the top-k as BYTES
``"<value>:<index>[:<label>]"`` per batch item, Triton's classification extension) and writes
each output as JSON ``data`` or, when it asks ``binary_data`` (or the request asks
``binary_data_output``), as binary data after the JSON header: the body is then
``application/octet-stream`` with an ``Inference-Header-Content-Length`` header and each binary
output carries ``parameters.binary_data_size``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import BadInput
from . import oip_binary, shm
from .envelopes import flatten, wrap_result
from .oip import HEADER_LENGTH, parameters
from .oip_encoding import encode_content, pick_encoding
from .responses import dumps


def encode(
    outputs: list[dict[str, Any]],
    request: dict[str, Any],
    head: dict[str, Any],
    labels: Mapping[str, Any] | None = None,
) -> tuple[bytes, str, dict[str, str]]:
    """``(body, content_type, headers)`` for ``outputs``; ``head`` holds the response's
    ``model_name``/``model_version``/``id``/``parameters``. Raises BadInput."""
    binary_default = parameters(request).get("binary_data_output") is True
    entries: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for output, asked in _selected(outputs, request):
        name, datatype, array = _array_of(output)
        params = parameters(asked)
        slot = asked.get(shm.SLOT)
        if slot is None:
            array = shm.on_host(array, datatype)
        classes = params.get("classification")
        if classes is not None:
            array, datatype = classify(array, datatype, int(classes), labels, name), "BYTES"
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        extra = dict(output.get("parameters") or {})
        if slot is not None:  # its bytes go to the client's region; the entry says no more
            shm.write(slot, array, datatype, name)
        elif params.get("binary_data", binary_default) is True:
            data = oip_binary.to_binary(array, datatype)
            chunks.append(data)
            entry["parameters"] = {**extra, "binary_data_size": len(data)}
        else:
            if extra:
                entry["parameters"] = extra
            entry["data"] = oip_binary.to_json(array, datatype)
        entries.append(entry)
    header = dumps({**head, "outputs": entries})
    if not chunks:
        return header, "application/json", {}
    body = b"".join([header, *chunks])
    return body, "application/octet-stream", {HEADER_LENGTH: str(len(header))}


def _selected(
    outputs: list[dict[str, Any]], request: dict[str, Any]
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``(output, its request entry)`` for each requested output, in the requested order."""
    requested = request.get("outputs") or []
    if not requested:
        return [(output, {}) for output in outputs]
    by_name = {str(o.get("name")): o for o in outputs}
    pairs = []
    for asked in requested:
        output = by_name.get(asked["name"])
        if output is None:
            known = list(by_name)
            raise BadInput(f"unknown output {asked['name']!r}; the model's outputs are {known}")
        pairs.append((output, asked))
    return pairs


def _array_of(output: dict[str, Any]) -> tuple[str, str, Any]:
    name = str(output.get("name"))
    array = output.get("array")
    datatype = output.get("datatype")
    if array is None:
        array = _from_data(output.get("data"), str(datatype), output.get("shape"))
    if not isinstance(array, np.ndarray) and not getattr(array, "is_cuda", False):
        array = np.asarray(array)  # a tensor on the GPU stays there: shm.write or shm.on_host
    if not isinstance(datatype, str):
        datatype = oip_binary.datatype_of(array)
    return name, datatype, array


def _from_data(data: Any, datatype: str, shape: Any) -> np.ndarray:
    flat = flatten(data)
    if datatype == "BYTES":
        array = np.empty(len(flat), dtype=object)
        array[:] = flat
    elif datatype == "BF16":
        array = oip_binary.bf16_bits(np.asarray(flat, dtype=np.float32))
    else:
        array = np.asarray(flat, dtype=oip_binary.NUMPY_DTYPES.get(datatype))
    return array.reshape(shape) if isinstance(shape, list) else array


def classify(
    array: np.ndarray, datatype: str, k: int, labels: Mapping[str, Any] | None, name: str
) -> np.ndarray:
    """Top-``k`` ``"<value>:<index>[:<label>]"`` strings per batch item (shape ``[batch, k]``;
    ``[k]`` for a 1-D output), as Triton's classification extension: an integer output's value
    is written as the integer (``"7:2"``), any other's as C's ``%f`` (``"0.600000:1"``)."""
    if datatype == "BYTES":
        raise BadInput(f"output {name!r} is BYTES: it cannot be classified")
    values = oip_binary.bf16_floats(array) if datatype == "BF16" else np.asarray(array)
    whole = values.dtype.kind in "iu"
    if not whole:
        values = values.astype(np.float64, copy=False)
    rows = values.reshape(1, -1) if values.ndim <= 1 else values.reshape(values.shape[0], -1)
    k = min(k, rows.shape[1])
    # Largest first, ties by index; ~x orders integers (signed or not) without overflow.
    top = np.argsort(~rows if whole else -rows, axis=1, kind="stable")[:, :k]
    out = np.empty(top.shape, dtype=object)
    for b in range(top.shape[0]):
        for j in range(k):
            index = int(top[b, j])
            value = rows[b, index]
            text = f"{int(value) if whole else format(value, 'f')}:{index}"
            label = _label(labels, index)
            out[b, j] = f"{text}:{label}" if label is not None else text
    return out.reshape(-1) if values.ndim <= 1 else out


def _label(labels: Mapping[str, Any] | None, index: int) -> str | None:
    if not labels:
        return None
    label = labels.get(str(index))
    if isinstance(label, list) and label:
        label = label[-1]
    return None if label is None else str(label)


def reply(
    item: Any,
    native: bool,
    request: dict[str, Any],
    model: tuple[str, str, Any, Any],
    request_headers: Mapping[str, str],
) -> tuple[bytes, str, dict[str, str]]:
    """The encoded response for one handler result: a native v2 handler's output list (or
    ``{"outputs": [...], "parameters": {...}}``), else its result wrapped as one output;
    compressed when the request's ``Accept-Encoding`` takes gzip or deflate. ``model`` is
    ``(name, version, labels, signature)``: labels the handler's ``{index: label}`` mapping."""
    name, version, labels, signature = model
    head: dict[str, Any] = {"model_name": name}
    if version:
        head["model_version"] = version
    if "id" in request:
        head["id"] = request["id"]
    labels = labels if isinstance(labels, Mapping) else None
    if native and isinstance(item, dict) and "outputs" in item:
        if isinstance(item.get("parameters"), dict):
            head = {**head, "parameters": item["parameters"]}
        outputs = item["outputs"]
    else:
        default = signature.outputs[0].name if signature and signature.outputs else "output0"
        outputs = item if native else wrap_result(item, request, default)
    sequence_id = parameters(request).get("sequence_id")
    if sequence_id is not None:  # a sequence's answer names it, as Triton's does
        head["parameters"] = {**head.get("parameters", {}), "sequence_id": sequence_id}
    body, content_type, headers = encode(outputs, request, head, labels)
    coding = pick_encoding(request_headers.get("accept-encoding"))
    if coding is not None:
        body = encode_content(body, coding)
        headers["content-encoding"] = coding
    return body, content_type, headers
