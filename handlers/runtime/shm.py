"""Tensors in the clients' shared-memory regions, as the worker reads and writes them.

Triton's shared-memory extension (``server/plane/shm.py`` is the server's registry): an input or
a requested output whose ``parameters`` name a ``shared_memory_region`` (with
``shared_memory_byte_size`` and an optional ``shared_memory_offset``) has its bytes in that
region, never in the request or the response. The frontend hands each request the table of
registered regions (``WireRequest.regions``: ``{name: [key, offset, byte_size]}``); here
:func:`locate` checks a tensor's parameters against it (Triton's messages, 400), :func:`read`
copies an input's bytes out and :func:`write` puts an output's bytes into the client's region.

The worker never maps a client's object: it reads an input's bytes with ``pread`` into memory of
its own and writes an output's with ``pwrite``, opening the object and checking its size on every
request. A mapping would fault the worker (SIGBUS) when the client shrinks its object while a
request reads or writes it (Triton's server itself faults so); a read of a shrunk object only
comes back short, which is a 400, and a write past the object's new end grows it again. Each
tensor costs one copy, as it did mapped (the tensor handler copied a mapped input into the
model's memory, and an output is copied into the region in either case); an input arrives
writable, so the tensor handler uses it as it is and a handler cannot write into the client's
region through it. Nothing stays open or mapped between requests: an object the client unlinks
is freed at once, however large it is (a sparse object of any size too), and an object unlinked
and made again under the same name is simply opened anew.

A CUDA region's entry has a fourth item, its GPU (``[handle, 0, byte_size, device]``); its slot
is read and written by ``cuda_shm.py``, imported only when a request names one. Torch-free.
"""

from __future__ import annotations

import io
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import BadInput
from . import oip_binary

SHM_DIR = "/dev/shm"
SLOT = "shm_slot"  # the key of a parsed request's output entry that sits in a region
UINT64_MAX = (1 << 64) - 1  # Triton reads the sizes and offsets as uint64
SIZE_FIELD = "shared_memory_byte_size"  # what an input's size errors name (not binary_data_size)
Table = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Slot:
    """``size`` bytes at ``start`` of the object ``key``, the part of ``region`` a tensor uses.
    A CUDA region's slot has its GPU (``device``) and, once bound, its opened handle
    (``owner``: held as long as the slot, see ``cuda_shm.py``)."""

    region: str
    key: str
    start: int
    size: int
    device: int | None = None
    owner: Any = field(default=None, compare=False, repr=False)


def placed(params: Mapping[str, Any]) -> bool:
    """Whether a tensor's parameters put it in a shared-memory region."""
    return "shared_memory_region" in params


def locate(table: Table | None, params: Mapping[str, Any], what: str) -> Slot:
    """The slot the parameters name, checked against the registered regions (400s; 404 for a
    region that is not registered)."""
    region = params.get("shared_memory_region")
    if not isinstance(region, str):
        raise BadInput("Unable to parse 'shared_memory_region'")
    size, offset = params.get("shared_memory_byte_size"), params.get("shared_memory_offset", 0)
    if type(size) is not int or not 0 <= size <= UINT64_MAX:
        raise BadInput(
            f"{what}: 'shared_memory_byte_size' must be a non-negative integer given with "
            "'shared_memory_region'"
        )
    if type(offset) is not int or not 0 <= offset <= UINT64_MAX:
        raise BadInput("Unable to parse 'shared_memory_offset'")
    entry = (table or {}).get(region)
    if entry is None:  # Triton's TRITONSERVER_ERROR_NOT_FOUND: 404, gRPC NOT_FOUND
        raise BadInput(f"Unable to find shared memory region: '{region}'", 404)
    key, base, byte_size = entry[:3]
    if offset >= byte_size:
        raise BadInput(f"Invalid offset for shared memory region: '{region}'")
    if size > UINT64_MAX - offset:  # Triton's words (its sizes are uint64: the sum wraps)
        raise BadInput(
            f"Integer overflow detected: byte_size ({size}) + offset ({offset}) exceeds maximum "
            f"value ({UINT64_MAX}) for region '{region}'"
        )
    if offset + size > byte_size:
        raise BadInput(f"Invalid offset + byte size for shared memory region: '{region}'")
    device = int(entry[3]) if len(entry) > 3 else None
    return Slot(region, str(key), int(base) + offset, size, device)


def _open(slot: Slot) -> int:
    """The region's object, opened read-write; checked to still hold the slot's bytes (a
    region that shrank is a 400 here, not a fault later)."""
    path = os.path.join(SHM_DIR, slot.key.lstrip("/"))
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        raise BadInput(f"Unable to open shared memory region: '{slot.key}'") from None
    try:
        if os.fstat(fd).st_size < slot.start + slot.size:
            raise BadInput(_shrunk(slot))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _shrunk(slot: Slot) -> str:
    return f"shared memory region '{slot.region}' is smaller than its registered size"


def read(slot: Slot) -> memoryview:
    """The slot's bytes, copied out of the client's object into a writable buffer of this
    worker (see the module docstring); 400 when the object is gone or shorter."""
    buffer = np.empty(slot.size, np.uint8)
    view = memoryview(buffer)
    done = 0
    fd = _open(slot)
    try:
        while done < slot.size:  # one read moves at most ~2 GiB
            got = os.preadv(fd, [view[done:]], slot.start + done)
            if got <= 0:
                raise BadInput(_shrunk(slot))
            done += got
    except OSError as exc:
        message = f"Unable to read shared memory region '{slot.region}': {exc.strerror}"
        raise BadInput(message) from None
    finally:
        os.close(fd)
    return view


def _read_elements(slot: Slot, count: int, name: str) -> np.ndarray:
    """A BYTES input's elements, read from the client's object as they are parsed (a buffered
    MiB at a time): a slot far larger than its elements (a sparse object) is refused at its
    first extra byte, never read whole into memory."""
    fd = _open(slot)
    try:
        with io.BufferedReader(io.FileIO(fd, "rb", closefd=False), 1 << 20) as reader:
            reader.seek(slot.start)

            def take(size: int) -> bytes:
                data = reader.read(size)
                if len(data) < size:
                    raise BadInput(_shrunk(slot))
                return data

            return oip_binary.bytes_elements(take, slot.size, count, name, SIZE_FIELD)
    except OSError as exc:
        message = f"Unable to read shared memory region '{slot.region}': {exc.strerror}"
        raise BadInput(message) from None
    finally:
        os.close(fd)


def _write(slot: Slot, data: memoryview) -> None:
    """Put ``data`` at the slot's start in the client's object."""
    done = 0
    fd = _open(Slot(slot.region, slot.key, slot.start, len(data)))
    try:
        while done < len(data):
            done += os.pwrite(fd, data[done:], slot.start + done)
    except OSError as exc:  # a sparse object on a full /dev/shm: ENOSPC
        message = f"Unable to write shared memory region '{slot.region}': {exc.strerror}"
        raise BadInput(message) from None
    finally:
        os.close(fd)


def read_input(table: Table | None, tensor: dict[str, Any], has_data: bool, model: str = "") -> Any:
    """The array of an input in a region (Triton's rule: one of ``data``, ``binary_data_size``
    or ``shared_memory_region``); in a CUDA region, a torch tensor on its GPU, whose slot the
    input keeps (``tensor[SLOT]``) for as long as the request lives."""
    name, params = tensor["name"], tensor.get("parameters") or {}
    if has_data or "binary_data_size" in params:
        both = "'data'" if has_data else "'binary_data_size'"
        raise BadInput(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            f"'parameters', 'shared_memory_region' in 'parameters'. But set {both} "
            "'shared_memory_region'"
        )
    slot = locate(table, params, f"input {name!r}")
    if slot.device is not None:
        from . import cuda_shm  # torch: only in a worker that is sent a CUDA region

        slot = tensor[SLOT] = cuda_shm.bind(slot, table)
        return cuda_shm.read_input(slot, tensor["datatype"], list(tensor["shape"]), name, model)
    datatype, shape = tensor["datatype"], list(tensor["shape"])
    oip_binary.check_size(slot.size, datatype, shape, name, model)  # before reading them
    if datatype == "BYTES":
        return _read_elements(slot, math.prod(shape), name).reshape(shape)
    return oip_binary.from_binary(read(slot), datatype, shape, name, model)


def check_output(table: Table | None, output: dict[str, Any]) -> None:
    """A requested output placed in a region gets its slot (``output[SLOT]``); 400 when the
    region is wrong or the output also asks for classification or binary data."""
    params = output.get("parameters") or {}
    if not placed(params):
        return
    if "classification" in params:
        raise BadInput("Output can't set both 'shared_memory_region' and 'classification'")
    if params.get("binary_data") is True:
        raise BadInput("Output can't set both 'shared_memory_region' and 'binary_data'")
    slot = locate(table, params, f"output {output['name']!r}")
    if slot.device is not None:
        from . import cuda_shm

        slot = cuda_shm.bind(slot, table)
    output[SLOT] = slot


def release_unnamed(table: Table | None) -> None:
    """Let go of the CUDA handles no region of ``table`` names any more: called when the
    frontend says a CUDA region was unregistered (its ``Regions`` message, the regions left), and
    for every v2 request, which carries them too."""
    cuda = sys.modules.get(f"{__package__}.cuda_shm")  # loaded once a CUDA region was used
    if cuda is not None:
        cuda.HANDLES.forget_unnamed(table)


def on_host(value: Any, datatype: str) -> np.ndarray:
    """An output as a host array: a handler's output left on the GPU (a torch tensor) is
    brought to the host; anything else is already there."""
    if isinstance(value, np.ndarray) or not getattr(value, "is_cuda", False):
        return np.asarray(value)
    from . import cuda_shm

    return cuda_shm.host(value, datatype)


def write(slot: Slot, array: Any, datatype: str, name: str) -> None:
    """Put an output's bytes (the binary tensor data layout) into its slot."""
    if slot.device is not None:
        from . import cuda_shm

        cuda_shm.write(slot, array, datatype, name)
        return
    array = on_host(array, datatype)
    if datatype in ("BYTES", "BF16"):
        data = memoryview(oip_binary.to_binary(array, datatype))
    else:
        data = memoryview(np.ascontiguousarray(array, oip_binary.NUMPY_DTYPES[datatype]))
    data = data.cast("B")
    if len(data) > slot.size:
        raise BadInput(
            f"shared memory size specified with the request for output '{name}' "
            f"({slot.size} bytes) should be at least {len(data)} bytes to hold the results"
        )
    if len(data):
        _write(slot, data)
