"""The tensor handler's TorchServe-style bodies (``tensor.py``): the ``x-input-shape`` header and
``.npy`` payloads, read without trusting what a header claims."""

from __future__ import annotations

import io
import math

import numpy as np
import torch

from .errors import BadInput, PredictionException

MAX_DIMS = 64


def parse_shape(text: str) -> list[int]:
    try:
        shape = [int(p) for p in str(text).replace("x", ",").split(",") if p.strip()]
    except ValueError as exc:
        raise BadInput(f"invalid x-input-shape {text!r}: want e.g. '1,28,28'") from exc
    if any(d <= 0 for d in shape):
        raise BadInput(f"invalid x-input-shape {text!r}: dimensions must be positive")
    if len(shape) > MAX_DIMS:  # numpy's limit; deeper answers are past JSON's recursion
        raise BadInput(f"invalid x-input-shape: {len(shape)} dimensions, at most {MAX_DIMS}")
    return shape


def load_npy(payload: bytes) -> np.ndarray:
    """An .npy payload whose header agrees with its size (no allocation a header merely claims)."""
    stream = io.BytesIO(payload)
    fmt = np.lib.format
    try:
        major, _ = fmt.read_magic(stream)
        if major in (1, 2):
            read = fmt.read_array_header_1_0 if major == 1 else fmt.read_array_header_2_0
            shape, _, dtype = read(stream)
            want = math.prod(shape) * dtype.itemsize
            if not dtype.hasobject and len(payload) - stream.tell() != want:
                raise BadInput(
                    f".npy header declares shape {list(shape)} of {dtype}, "
                    f"but the payload does not hold {want} bytes"
                )
        return np.load(io.BytesIO(payload), allow_pickle=False)
    except MemoryError as exc:
        raise PredictionException(".npy payload too large to load", 413) from exc
    except (ValueError, OSError, EOFError, TypeError) as exc:
        raise BadInput(f"invalid .npy payload: {exc}") from exc


def npy_tensor(array: np.ndarray) -> torch.Tensor:
    """A loaded .npy as a tensor: in native byte order; BadInput for a dtype no tensor has."""
    if array.dtype.kind not in "biufc":  # strings, records, datetimes, objects
        raise BadInput(f".npy dtype {array.dtype} is not a numeric tensor type")
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    try:
        return torch.from_numpy(np.ascontiguousarray(array))
    except TypeError as exc:  # e.g. float128
        raise BadInput(f".npy dtype {array.dtype} has no tensor type") from exc
