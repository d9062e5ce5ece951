"""Triton's shared-memory extensions over gRPC, on ``inference.GRPCInferenceService``:
``SystemSharedMemoryStatus|Register|Unregister`` and ``CudaSharedMemoryStatus|Register|Unregister``.

Each RPC is the REST endpoint's adapter (``http/shm.py``) in gRPC's shape: the same registry of
the data plane (``plane/shm.py``), the same keys (status the inference key, register and
unregister the management key), the same errors as gRPC statuses. Torch-free.
"""

from __future__ import annotations

from typing import Any

import grpc

from torchbay.server.grpc.messages import message
from torchbay.server.grpc.triton import TritonExtensions

# Each RPC of this module and the plane operation it serves (for ServerMetadata's extensions).
OPERATIONS = {
    "SystemSharedMemoryStatus": "shm_status",
    "SystemSharedMemoryRegister": "shm_register",
    "SystemSharedMemoryUnregister": "shm_unregister",
    "CudaSharedMemoryStatus": "cuda_shm_status",
    "CudaSharedMemoryRegister": "cuda_shm_register",
    "CudaSharedMemoryUnregister": "cuda_shm_unregister",
}


class SharedMemoryRpcs(TritonExtensions):
    """The RPCs of this module; a part of the OIP service (``grpc/oip.py``)."""

    async def system_shared_memory_status(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        async def work() -> Any:
            response = message("inference.SystemSharedMemoryStatusResponse")()
            for region in self.calls.plane.shm.status("system", request.name or None):
                response.regions[region["name"]].CopyFrom(
                    message("inference.SystemSharedMemoryStatusResponse.RegionStatus")(**region)
                )
            return response

        return await self._run(context, "inference", work)

    async def system_shared_memory_register(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        async def work() -> Any:
            self.calls.plane.shm.register_system(
                request.name, request.key, request.offset, request.byte_size
            )
            return message("inference.SystemSharedMemoryRegisterResponse")()

        return await self._run(context, "management", work)

    async def system_shared_memory_unregister(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        async def work() -> Any:
            self.calls.plane.shm.unregister("system", request.name or None)
            return message("inference.SystemSharedMemoryUnregisterResponse")()

        return await self._run(context, "management", work)

    async def cuda_shared_memory_status(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        async def work() -> Any:
            response = message("inference.CudaSharedMemoryStatusResponse")()
            for region in self.calls.plane.shm.status("cuda", request.name or None):
                response.regions[region["name"]].CopyFrom(
                    message("inference.CudaSharedMemoryStatusResponse.RegionStatus")(**region)
                )
            return response

        return await self._run(context, "inference", work)

    async def cuda_shared_memory_register(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        async def work() -> Any:
            self.calls.plane.shm.register_cuda(
                request.name, request.raw_handle, request.device_id, request.byte_size
            )
            return message("inference.CudaSharedMemoryRegisterResponse")()

        return await self._run(context, "management", work)

    async def cuda_shared_memory_unregister(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        async def work() -> Any:
            self.calls.plane.shm.unregister("cuda", request.name or None)
            return message("inference.CudaSharedMemoryUnregisterResponse")()

        return await self._run(context, "management", work)
