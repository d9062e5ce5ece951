"""The real CUDA IPC seam (handlers/runtime/cuda_ipc.py) across two processes: this one
allocates device memory with ``cudaMalloc`` and exports it (``cudaIpcGetMemHandle``), a child
opens the handle with the seam, reads a tensor there without a copy, copies its result into the
allocation and closes the handle; this process then reads what the child wrote. A handle cannot
be opened by the process that made it, hence the child. That test needs a GPU and is skipped
without one (the layers above the seam are tested on CPU with a fake, test_cuda_shm.py)."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest
import torch

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CHILD = """
import sys, torch
from torchbay.handlers.runtime import cuda_ipc
handle = bytes.fromhex(sys.argv[1])
ptr = cuda_ipc.open_handle(handle, 0)
x = cuda_ipc.tensor_at(ptr, 0, 64, torch.int32, [1, 16], 0)
assert x.is_cuda and x.data_ptr() == ptr, (x.device, x.data_ptr(), ptr)
cuda_ipc.copy_into(ptr, 64, x * 2, 0)
print(int(x.sum()))
cuda_ipc.close_handle(ptr, 0)
"""


@GPU
def test_a_child_process_reads_and_writes_device_memory_through_the_seam() -> None:
    from torchbay.handlers.runtime import cuda_ipc

    lib = cuda_ipc._cudart()
    lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.cudaIpcGetMemHandle.argtypes = [ctypes.POINTER(cuda_ipc.IpcMemHandle), ctypes.c_void_p]
    lib.cudaFree.argtypes = [ctypes.c_void_p]
    ptr = ctypes.c_void_p()
    with torch.cuda.device(0):
        assert lib.cudaMalloc(ctypes.byref(ptr), 128) == 0
    try:
        address = int(ptr.value or 0)
        mine = cuda_ipc.tensor_at(address, 0, 128, torch.int32, [2, 16], 0)
        mine.copy_(torch.arange(32, dtype=torch.int32).reshape(2, 16))
        torch.cuda.synchronize()
        handle = cuda_ipc.IpcMemHandle()
        assert lib.cudaIpcGetMemHandle(ctypes.byref(handle), ptr) == 0
        done = subprocess.run(
            [sys.executable, "-c", CHILD, bytes(handle).hex()],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.strip() == str(sum(range(16)))
        assert mine[1].tolist() == [2 * i for i in range(16)]  # the child's copy_into
    finally:
        lib.cudaFree(ptr)


def test_a_handle_of_the_wrong_length_is_refused() -> None:
    """Checked before any CUDA call: this one runs without a GPU too."""
    from torchbay.handlers.runtime import cuda_ipc

    with pytest.raises(cuda_ipc.CudaError, match="64 bytes"):
        cuda_ipc.open_handle(b"\0" * 8, 0)
