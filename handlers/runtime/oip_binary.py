"""OIP tensor data as numpy arrays: JSON ``data`` and the binary tensor data extension.

Torch-free. Every tensor is one numpy array: numeric datatypes in their little-endian dtype (BF16,
which numpy lacks, is carried as ``uint16`` bit patterns and viewed as ``torch.bfloat16`` by the
tensor handler), BYTES as a 1-D object array of ``bytes`` (binary) or ``str`` (JSON).

Binary data (triton-inference-server/server docs/protocol/extension_binary_data.md): row-major,
little-endian, no padding; BOOL one byte 0/1; each BYTES element a 4-byte little-endian unsigned
length followed by its bytes. Binary decoding is ``np.frombuffer`` over the body (no copy); JSON
decoding is one ``np.asarray``. Every problem is a ``BadInput`` naming the tensor.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import BadInput
from .envelopes import flatten

NUMPY_DTYPES: dict[str, np.dtype] = {
    name: np.dtype(code)
    for name, code in {
        "BOOL": "?",
        "UINT8": "u1",
        "UINT16": "<u2",
        "UINT32": "<u4",
        "UINT64": "<u8",
        "INT8": "i1",
        "INT16": "<i2",
        "INT32": "<i4",
        "INT64": "<i8",
        "FP16": "<f2",
        "FP32": "<f4",
        "FP64": "<f8",
        "BF16": "<u2",
    }.items()
}
HALF = frozenset({"FP16", "BF16"})  # the datatypes an FP32 input may be cast to (oip.py)
_KINDS = {"BOOL": "b", "FP16": "iuf", "FP32": "iuf", "FP64": "iuf", "BF16": "iuf"}
_LENGTH = struct.Struct("<I")


def datatype_of(array: np.ndarray) -> str:
    """The OIP datatype of a numpy array (object arrays are BYTES)."""
    if array.dtype == object or array.dtype.kind in "SU":
        return "BYTES"
    for name, dtype in NUMPY_DTYPES.items():
        if name != "BF16" and array.dtype.newbyteorder("<") == dtype:
            return name
    raise ValueError(f"numpy dtype {array.dtype} has no OIP datatype")


def from_json(data: Any, datatype: str, shape: list[int], name: str) -> np.ndarray:
    """The array for a JSON ``data`` field (flat or nested), shaped ``shape``."""
    if datatype == "BYTES":
        flat = _flat_strings(data, name)
        _check_count(len(flat), shape, name)
        array = np.empty(len(flat), dtype=object)
        array[:] = flat
        return array.reshape(shape)
    try:
        raw = np.asarray(data)
    except (ValueError, TypeError, OverflowError) as exc:  # ragged nesting, odd values
        raise BadInput(f"input {name!r}: data is not a rectangular array of numbers") from exc
    _check_count(raw.size, shape, name)
    kinds = _KINDS.get(datatype, "iu")
    if raw.size and raw.dtype.kind not in kinds:
        want = {"b": "true/false", "iu": "integers", "iuf": "numbers"}[kinds]
        raise BadInput(f"input {name!r}: {datatype} data must be {want}")
    if datatype == "BF16":
        with np.errstate(over="ignore"):
            return bf16_bits(raw.astype(np.float32)).reshape(shape)
    dtype = NUMPY_DTYPES[datatype]
    if raw.size and dtype.kind in "iu":
        info = np.iinfo(dtype)
        if raw.min() < info.min or raw.max() > info.max:
            raise BadInput(f"input {name!r}: a value is out of range for {datatype}")
    with np.errstate(over="ignore"):  # 1e39 as FP32 is inf, as torch casts it
        return raw.astype(dtype, copy=False).reshape(shape)


def _check_count(count: int, shape: list[int], name: str) -> None:
    if count != math.prod(shape):
        raise BadInput(f"input {name!r}: {count} values do not fill shape {shape}")


def _flat_strings(data: Any, name: str) -> list[Any]:
    flat = flatten(data)
    if not all(isinstance(v, str) for v in flat):
        raise BadInput(f"input {name!r}: BYTES data must be strings")
    return flat


def from_binary(
    buffer: memoryview, datatype: str, shape: list[int], name: str, model: str = ""
) -> np.ndarray:
    """The array for one tensor's binary data (``buffer`` is exactly its ``binary_data_size``)
    of an input of ``model``."""
    count = math.prod(shape)
    if datatype == "BYTES":
        return _bytes_elements(buffer, count, name).reshape(shape)
    dtype = NUMPY_DTYPES[datatype]
    check_size(len(buffer), datatype, shape, name, model)
    if datatype == "BOOL":
        raw = np.frombuffer(buffer, dtype=np.uint8)
        if raw.size and raw.max() > 1:
            raise BadInput(f"input {name!r}: BOOL bytes must be 0 or 1")
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


def check_size(size: int, datatype: str, shape: list[int], name: str, model: str = "") -> None:
    """400 unless ``size`` bytes (its ``binary_data_size``, or ``shared_memory_byte_size`` for a
    tensor in a region) are exactly ``shape``'s values of ``datatype`` (BYTES, of elements of
    any length, needs at least their 4-byte lengths)."""
    count = math.prod(shape)
    if datatype == "BYTES":
        if count * 4 > size:
            raise BadInput(f"input {name!r}: {size} bytes cannot hold {count} BYTES elements")
        return
    expected = count * NUMPY_DTYPES[datatype].itemsize
    if size != expected:
        raise size_mismatch(name, model, expected, size)


def size_mismatch(name: str, model: str, expected: int, size: int) -> BadInput:
    """Triton's words for an input whose bytes are not its shape's (core ``infer_request.cc``:
    what its clients' scripts match on)."""
    return BadInput(
        f"input byte size mismatch for input '{name}' for model '{model}'. Expected {expected}, "
        f"got {size}"
    )


def _bytes_elements(buffer: memoryview, count: int, name: str) -> np.ndarray:
    offset = 0

    def take(size: int) -> memoryview:
        nonlocal offset
        offset += size
        return buffer[offset - size : offset]

    return bytes_elements(take, len(buffer), count, name)


def bytes_elements(
    take: Callable[[int], bytes | memoryview],
    size: int,
    count: int,
    name: str,
    field: str = "binary_data_size",
) -> np.ndarray:
    """``count`` BYTES elements out of ``size`` bytes, which ``take(n)`` gives ``n`` at a time
    (a request body's binary data, or a client's shared-memory object read as it goes: never
    more than the elements it holds, whatever ``size`` claims)."""
    if count * 4 > size:  # checked before allocating: every element has a 4-byte length
        raise BadInput(f"input {name!r}: {size} bytes cannot hold {count} BYTES elements")
    out = np.empty(count, dtype=object)
    offset = 0
    for i in range(count):
        if offset + 4 > size:
            raise BadInput(f"input {name!r}: BYTES data ends inside element {i} of {count}")
        (length,) = _LENGTH.unpack(take(4))
        offset += 4
        if offset + length > size:
            raise BadInput(f"input {name!r}: BYTES element {i} runs past {field} ({size})")
        out[i] = bytes(take(length))
        offset += length
    if offset != size:
        raise BadInput(f"input {name!r}: {size - offset} bytes left after {count} BYTES elements")
    return out


def to_binary(array: np.ndarray, datatype: str) -> bytes:
    """The binary form of an output array."""
    if datatype == "BYTES":
        parts = []
        for item in array.reshape(-1):
            data = _as_bytes(item)
            parts.append(_LENGTH.pack(len(data)))
            parts.append(data)
        return b"".join(parts)
    dtype = NUMPY_DTYPES[datatype]
    return np.ascontiguousarray(array, dtype=dtype).tobytes()


def to_json(array: np.ndarray, datatype: str) -> list[Any]:
    """The flat JSON ``data`` of an output array (BF16 as floats, BYTES as strings)."""
    flat = array.reshape(-1)
    if datatype == "BYTES":
        return [_as_str(item) for item in flat]
    if datatype == "BF16":
        return bf16_floats(flat).tolist()
    return flat.tolist()


def _as_bytes(item: Any) -> bytes:
    if isinstance(item, (bytes, bytearray)):
        return bytes(item)
    return str(item).encode("utf-8")


def _as_str(item: Any) -> str:
    if isinstance(item, (bytes, bytearray)):
        return bytes(item).decode("utf-8", "replace")
    return str(item)


def to_half(values: np.ndarray, datatype: str) -> np.ndarray:
    """FP32 ``values`` as ``datatype`` (FP16 or BF16, in their array forms), rounded to nearest
    even as torch casts; values past the half range become infinities, as in torch."""
    if datatype == "BF16":
        return bf16_bits(values)
    with np.errstate(over="ignore"):
        return values.astype(NUMPY_DTYPES["FP16"])


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 values as bfloat16 bit patterns (uint16), rounded to nearest even."""
    bits = np.ascontiguousarray(values, dtype="<f4").view("<u4")
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    rounded = np.where(np.isnan(values), np.uint32(0x7FC0), rounded)
    return rounded.astype("<u2")


def bf16_floats(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) as float32 values."""
    return (np.asarray(bits, dtype="<u2").astype("<u4") << 16).view("<f4")
