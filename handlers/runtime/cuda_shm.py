"""Tensors in the clients' CUDA shared-memory regions, as the worker reads and writes them.

Triton's ``cuda_shared_memory`` extension (``server/plane/shm.py`` is the server's registry;
``shm.py`` here locates a tensor's slot in a region, for both kinds). A CUDA region reaches the
worker as the client's ``cudaIpcMemHandle_t`` (base64), its size and its GPU. The worker opens
each handle ONCE (``Handles``, kept for the next request: opening maps the client's allocation
into this process, which costs far more than a request's work on it), and an input is a torch
tensor over the client's device memory, with no copy (:func:`read_input`); the model reads it
where it lies. An output is copied once into the client's region (:func:`write`):
device-to-device when the handler's output is on the GPU, host-to-device when the handler
brought it to the host (the built-in handlers' device path answers on the host).

Every CUDA call goes through one seam, :func:`seam` (``cuda_ipc.py``: open, close, a tensor at
an address, a copy into one). ``TORCHBAY_CUDA_IPC`` names a Python file that replaces it; the
tests use a fake there that backs "device memory" by host memory, to run all of this on CPU.

A handle is closed (``cudaIpcCloseMemHandle``) once no registered region names it any more (the
frontend tells every worker when a CUDA region is unregistered, as Triton closes it then; a
request's table shows it too) AND no request still holds a slot of it: each slot holds its
``Opened``, and the close runs when the last reference goes. So a client that unregisters a
region while a request uses it never makes the worker read unmapped memory; the handles still
open when the worker exits are closed then (the driver releases them with the process anyway).
"""

from __future__ import annotations

import base64
import dataclasses
import importlib.util
import math
import os
import weakref
from collections.abc import Mapping
from functools import cache
from typing import Any

import numpy as np
import torch

from ..errors import BadInput
from . import oip_binary
from .oip_binary import NUMPY_DTYPES

SEAM_ENV = "TORCHBAY_CUDA_IPC"
DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "UINT8": torch.uint8,
    **{f"INT{bits}": getattr(torch, f"int{bits}") for bits in (8, 16, 32, 64)},
    **{f"UINT{bits}": getattr(torch, f"uint{bits}") for bits in (16, 32, 64)},
    **{f"FP{bits}": getattr(torch, f"float{bits}") for bits in (16, 32, 64)},
    "BF16": torch.bfloat16,
}


@cache
def seam() -> Any:
    """The module of the four CUDA calls: ``cuda_ipc``, or the file ``TORCHBAY_CUDA_IPC`` names."""
    path = os.environ.get(SEAM_ENV)
    if not path:
        from . import cuda_ipc

        return cuda_ipc
    spec = importlib.util.spec_from_file_location("torchbay_cuda_ipc_seam", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"{SEAM_ENV}={path!r} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Opened:
    """One client handle opened in this worker: the device pointer of its allocation. Closed
    when the last reference to it goes (see the module docstring)."""

    def __init__(self, key: str, device: int) -> None:
        calls = seam()
        self.device = device
        try:
            self.ptr = calls.open_handle(base64.b64decode(key), device)
        except Exception as exc:  # CUDA's error: the client's handle is not a live allocation
            raise BadInput(f"Unable to open CUDA shared memory handle: {exc}") from None
        weakref.finalize(self, calls.close_handle, self.ptr, device)


class Handles:
    """The handles this worker opened, one per (handle, device), kept while a region names it."""

    def __init__(self) -> None:
        self._open: dict[tuple[str, int], Opened] = {}
        self._named: frozenset[tuple[str, int]] = frozenset()

    def get(self, key: str, device: int) -> Opened:
        opened = self._open.get((key, device))
        if opened is None:
            opened = self._open[(key, device)] = Opened(key, device)
        return opened

    def forget_unnamed(self, table: Mapping[str, Any] | None) -> None:
        """Let go of the handles no CUDA region of ``table`` names (closed once unused)."""
        named = frozenset(
            (str(entry[0]), int(entry[3])) for entry in (table or {}).values() if len(entry) > 3
        )
        if named == self._named:
            return
        self._named = named
        for ident in [i for i in self._open if i not in named]:
            del self._open[ident]


HANDLES = Handles()


def bind(slot: Any, table: Mapping[str, Any] | None) -> Any:
    """``slot`` (a ``shm.Slot`` of a CUDA region) holding its opened handle."""
    HANDLES.forget_unnamed(table)
    return dataclasses.replace(slot, owner=HANDLES.get(slot.key, slot.device))


def read_input(
    slot: Any, datatype: str, shape: list[int], name: str, model: str = ""
) -> torch.Tensor:
    """The input's tensor over the client's device memory (no copy); 400 for a size that is
    not the shape's, a datatype that cannot lie there, or an offset the datatype cannot use."""
    dtype = DTYPES.get(datatype)
    if dtype is None:
        raise BadInput(f"input {name!r}: {datatype} tensors cannot be read from CUDA shared memory")
    count = math.prod(shape)
    nbytes = count * dtype.itemsize
    if slot.size != nbytes:
        raise oip_binary.size_mismatch(name, model, nbytes, slot.size)
    _aligned(slot, dtype.itemsize, name)
    opened = slot.owner
    return seam().tensor_at(opened.ptr, slot.start, nbytes, dtype, shape, opened.device)


def write(slot: Any, value: Any, datatype: str, name: str) -> None:
    """Copy an output (a tensor, on the GPU or the host, or a numpy array) into its slot."""
    if datatype not in DTYPES:
        raise BadInput(
            f"output {name!r}: {datatype} tensors cannot be written to CUDA shared memory"
        )
    tensor = value if isinstance(value, torch.Tensor) else _from_numpy(value, datatype)
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes > slot.size:
        raise BadInput(
            f"shared memory size specified with the request for output '{name}' "
            f"({slot.size} bytes) should be at least {nbytes} bytes to hold the results"
        )
    opened = slot.owner
    seam().copy_into(opened.ptr, slot.start, tensor, opened.device)


def host(value: Any, datatype: str) -> np.ndarray:
    """An output tensor the handler left on the GPU, as the host array the encoder writes
    (BF16 as its 16-bit pattern, as ``oip_binary`` keeps it)."""
    tensor = value.detach().cpu()
    if datatype == "BF16":
        return tensor.contiguous().view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()


def cast(value: torch.Tensor, datatype: str) -> torch.Tensor:
    """An FP32 input cast to the half datatype the model declares (on its device)."""
    return value.to(DTYPES[datatype])


def _from_numpy(array: np.ndarray, datatype: str) -> torch.Tensor:
    if datatype == "BF16":  # numpy holds BF16 as its bits
        return torch.from_numpy(np.ascontiguousarray(array).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(array, NUMPY_DTYPES[datatype]))


def _aligned(slot: Any, itemsize: int, name: str) -> None:
    """A tensor read in place starts at a multiple of its element size (a misaligned device
    read is a CUDA error that would end the worker's context)."""
    if slot.start % itemsize:
        raise BadInput(
            f"input {name!r}: shared_memory_offset {slot.start} of CUDA shared memory region "
            f"'{slot.region}' is not a multiple of the datatype's {itemsize}-byte elements"
        )
