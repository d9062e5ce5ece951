"""The worker's one seam to CUDA's IPC calls, for Triton's CUDA shared memory (``cuda_shm.py``).

Four calls, and nothing above them touches CUDA's runtime directly:

* :func:`open_handle`: ``cudaIpcOpenMemHandle`` of a client's ``cudaIpcMemHandle_t`` on a GPU,
  the device pointer of the client's allocation in this process;
* :func:`close_handle`: ``cudaIpcCloseMemHandle`` of that pointer;
* :func:`tensor_at`: a torch tensor over ``nbytes`` at ``ptr + offset``, with no copy: an object
  with ``__cuda_array_interface__`` given to ``torch.as_tensor`` (torch keeps that object alive
  as long as the tensor's storage, and never frees the memory: the client owns it);
* :func:`copy_into`: a tensor's bytes copied into ``ptr + offset`` (device-to-device when the
  tensor is on a GPU), finished before it returns, since the client reads the region as soon as
  the answer arrives.

The calls are made with ctypes on the CUDA runtime library torch itself loaded (the one in this
process's memory map once torch initialized CUDA), so the handle is opened in the very context
torch's tensors use. The tests run everything above this seam on CPU with a fake of these four
calls (``TORCHBAY_CUDA_IPC``, see ``cuda_shm.seam``); this module's own test needs a GPU.
"""

from __future__ import annotations

import ctypes
import functools

import torch

IPC_HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)
LAZY_ENABLE_PEER_ACCESS = 1  # cudaIpcMemLazyEnablePeerAccess, the one flag the call takes
SONAMES = ("libcudart.so.12", "libcudart.so.13", "libcudart.so.11.0", "libcudart.so")


class IpcMemHandle(ctypes.Structure):
    """``cudaIpcMemHandle_t``: 64 opaque bytes, passed by value."""

    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_BYTES)]


class CudaError(RuntimeError):
    """A CUDA runtime call failed; the message has the runtime's own words."""


@functools.cache
def _cudart() -> ctypes.CDLL:
    """The CUDA runtime torch loaded (after ``torch.cuda.init``): found in the memory map, else
    by its usual names (dlopen returns the copy already loaded under the same soname)."""
    torch.cuda.init()
    paths = []
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
            paths = [line.split()[-1] for line in maps if "libcudart" in line]
    except OSError:
        pass
    for name in [*dict.fromkeys(paths), *SONAMES]:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.cudaIpcOpenMemHandle.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            IpcMemHandle,
            ctypes.c_uint,
        ]
        lib.cudaIpcCloseMemHandle.argtypes = [ctypes.c_void_p]
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        return lib
    raise CudaError("the CUDA runtime library (libcudart) is not loaded in this process")


def _check(lib: ctypes.CDLL, code: int, call: str) -> None:
    if code != 0:
        text = lib.cudaGetErrorString(code).decode("ascii", "replace")
        raise CudaError(f"{call} failed: {text} (cudaError {code})")


def open_handle(handle: bytes, device: int) -> int:
    """The device pointer of the client's allocation ``handle`` exported, on GPU ``device``."""
    if len(handle) != IPC_HANDLE_BYTES:
        raise CudaError(f"a cudaIpcMemHandle_t has {IPC_HANDLE_BYTES} bytes, not {len(handle)}")
    lib = _cudart()
    ptr = ctypes.c_void_p()
    with torch.cuda.device(device):  # the runtime opens it in the current device's context
        code = lib.cudaIpcOpenMemHandle(
            ctypes.byref(ptr), IpcMemHandle.from_buffer_copy(handle), LAZY_ENABLE_PEER_ACCESS
        )
    _check(lib, code, "cudaIpcOpenMemHandle")
    return int(ptr.value or 0)


def close_handle(ptr: int, device: int) -> None:
    """Unmap the client's allocation from this process (the client's memory stays its own)."""
    lib = _cudart()
    with torch.cuda.device(device):
        _check(lib, lib.cudaIpcCloseMemHandle(ctypes.c_void_p(ptr)), "cudaIpcCloseMemHandle")


class _DeviceBytes:
    """``nbytes`` bytes of device memory at ``address``, as CUDA's array interface describes
    them to torch (``version`` 3: ``stream`` None, the caller orders its own work)."""

    def __init__(self, address: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (address, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }


def tensor_at(
    ptr: int, offset: int, nbytes: int, dtype: torch.dtype, shape: list[int], device: int
) -> torch.Tensor:
    """A ``dtype`` tensor of ``shape`` over ``nbytes`` at ``ptr + offset`` on GPU ``device``,
    sharing the client's memory (no copy)."""
    raw = torch.as_tensor(_DeviceBytes(ptr + offset, nbytes), device=f"cuda:{device}")
    return raw.view(dtype).view(shape)


def copy_into(ptr: int, offset: int, tensor: torch.Tensor, device: int) -> None:
    """``tensor``'s bytes into the client's memory at ``ptr + offset``, finished on return."""
    source = tensor.detach().contiguous().view(-1).view(torch.uint8)
    if source.numel() == 0:
        return
    target = tensor_at(ptr, offset, source.numel(), torch.uint8, [source.numel()], device)
    with torch.cuda.device(device):
        target.copy_(source)
        torch.cuda.current_stream(device).synchronize()
