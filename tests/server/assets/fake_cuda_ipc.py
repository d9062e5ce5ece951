"""A fake of the worker's CUDA IPC seam (``handlers/runtime/cuda_ipc.py``) for hosts without a
GPU: "device memory" is host memory, a POSIX shared-memory object the test makes, and a
"cudaIpcMemHandle_t" is 64 bytes naming it (``MAGIC`` + the object's name, NUL-padded).

The worker loads this file in place of the real seam when ``TORCHBAY_CUDA_IPC`` names it. Each
open and close is appended to the file ``TORCHBAY_FAKE_CUDA_LOG`` names (``open <name> <pid>``,
``close <name> <pid>``), so the test sees how often a worker opened a handle and when it closed
it. Like the real call, closing unmaps the memory even while a tensor still points at it: a
worker that closed a handle too early reads unmapped memory and dies, which the tests would see.
"""

from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np
import torch

MAGIC = b"TBFAKEIPC:"
HANDLE_BYTES = 64
_MAPS: dict[int, tuple[str, mmap.mmap]] = {}


def make_handle(name: str) -> bytes:
    """The fake handle of the shared-memory object ``name`` (as the test's client makes it)."""
    raw = MAGIC + name.lstrip("/").encode()
    assert len(raw) <= HANDLE_BYTES
    return raw.ljust(HANDLE_BYTES, b"\0")


def _log(event: str, name: str) -> None:
    path = os.environ.get("TORCHBAY_FAKE_CUDA_LOG")
    if path:
        with open(path, "a", encoding="ascii") as log:
            log.write(f"{event} {name} {os.getpid()}\n")


def open_handle(handle: bytes, device: int) -> int:
    if not handle.startswith(MAGIC):
        raise RuntimeError("invalid resource handle")  # CUDA's words for a handle it cannot open
    name = handle[len(MAGIC) :].rstrip(b"\0").decode()
    with open(f"/dev/shm/{name}", "r+b") as f:
        mapped = mmap.mmap(f.fileno(), 0)
    first = ctypes.c_char.from_buffer(mapped)
    ptr = ctypes.addressof(first)
    del first  # no export left: close_handle really unmaps (see the module docstring)
    _MAPS[ptr] = (name, mapped)
    _log("open", name)
    return ptr


def close_handle(ptr: int, device: int) -> None:
    name, mapped = _MAPS.pop(ptr)
    _log("close", name)
    mapped.close()


def tensor_at(
    ptr: int, offset: int, nbytes: int, dtype: torch.dtype, shape: list[int], device: int
) -> torch.Tensor:
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr + offset))
    return torch.from_numpy(raw).view(dtype).view(shape)


def copy_into(ptr: int, offset: int, tensor: torch.Tensor, device: int) -> None:
    source = tensor.detach().contiguous().view(-1).view(torch.uint8)
    if source.numel():
        tensor_at(ptr, offset, source.numel(), torch.uint8, [source.numel()], device).copy_(source)
