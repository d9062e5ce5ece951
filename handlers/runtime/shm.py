"""Tensors in the clients' shared-memory regions, as the worker reads and writes them.

Triton's shared-memory extension (``server/plane/shm.py`` is the server's registry): an input or
a requested output whose ``parameters`` name a ``shared_memory_region`` (with
``shared_memory_byte_size`` and an optional ``shared_memory_offset``) has its bytes in that
region, never in the request or the response. The frontend hands each request the table of
registered regions (``WireRequest.regions``: ``{name: [key, offset, byte_size]}``); here
:func:`locate` checks a tensor's parameters against it (Triton's messages, 400), :func:`read`
maps an input's bytes and :func:`write` puts an output's bytes into the client's region.

Nothing is copied on the way in: the worker maps the client's object once (``Mappings``,
kept for the next request: on this kind of host mapping 16 MiB costs ~25 ms of page-table work
and copying it ~3 ms) and an input's array is a READ-ONLY view of the client's bytes. A handler
cannot write into the client's region through it: the built-in tensor handler copies a read-only
input once into the model's own memory (as it does a request body it does not own), a native v2
handler gets the read-only array. An output is copied once, from the result into the region
(Triton copies too). The object is opened and its size checked on every request, so a region
that shrank or vanished is a 400, not a fault, and an object unlinked and made again under the
same name is mapped anew. A client that shrinks its object while a request is reading it can
still fault the worker (as with any ``mmap``, in Triton too; the worker is then restarted and
the request answered 503).

A CUDA region's entry has a fourth item, its GPU (``[handle, 0, byte_size, device]``); its slot
is read and written by ``cuda_shm.py``, imported only when a request names one. Torch-free.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import sys
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import BadInput
from . import oip_binary

SHM_DIR = "/dev/shm"
SLOT = "shm_slot"  # the key of a parsed request's output entry that sits in a region
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
    """The slot the parameters name, checked against the registered regions (400s)."""
    region = params.get("shared_memory_region")
    if not isinstance(region, str):
        raise BadInput("Unable to parse 'shared_memory_region'")
    size, offset = params.get("shared_memory_byte_size"), params.get("shared_memory_offset", 0)
    if type(size) is not int or size < 0:
        raise BadInput(
            f"{what}: 'shared_memory_byte_size' must be a non-negative integer given with "
            "'shared_memory_region'"
        )
    if type(offset) is not int or offset < 0:
        raise BadInput("Unable to parse 'shared_memory_offset'")
    entry = (table or {}).get(region)
    if entry is None:
        raise BadInput(f"Unable to find shared memory region: '{region}'")
    key, base, byte_size = entry[:3]
    if offset >= byte_size:
        raise BadInput(f"Invalid offset for shared memory region: '{region}'")
    if offset + size > byte_size:
        raise BadInput(f"Invalid offset + byte size for shared memory region: '{region}'")
    device = int(entry[3]) if len(entry) > 3 else None
    return Slot(region, str(key), int(base) + offset, size, device)


class Mappings:
    """The worker's mappings of the clients' shared-memory objects, one per object (its device
    and inode: an object unlinked and made again under the same name is a new one), made on
    first use and kept: mapping 16 MiB costs more than copying it (page tables), so a region
    used again is not mapped again. At most ``limit`` bytes stay mapped (least recently used
    go first), and a mapping of an object no registered region names any more is dropped when
    a request's table shows it (POSIX frees an unlinked object once no one maps it)."""

    def __init__(self, limit: int = 4 << 30) -> None:
        self.limit = limit
        self._maps: OrderedDict[tuple[int, int], tuple[str, mmap.mmap]] = OrderedDict()
        self._keys: frozenset[str] = frozenset()

    def view(self, slot: Slot) -> memoryview:
        """The slot's bytes, read-write, in this worker's mapping of its object."""
        fd = _open(slot)
        try:
            info = os.fstat(fd)
            ident = (info.st_dev, info.st_ino)
            found = self._maps.pop(ident, None)
            if found is None or len(found[1]) < slot.start + slot.size:
                found = (slot.key, mmap.mmap(fd, info.st_size))  # MAP_SHARED, read-write
                self._replaced(slot.key)
        finally:
            os.close(fd)
        self._maps[ident] = found
        self._evict()
        return memoryview(found[1])[slot.start : slot.start + slot.size]

    def forget_unnamed(self, table: Table | None) -> None:
        """Drop the mappings of objects no region of ``table`` names."""
        keys = frozenset(str(entry[0]) for entry in (table or {}).values())
        if keys == self._keys:
            return
        self._keys = keys
        for ident, (key, _) in list(self._maps.items()):
            if key not in keys:
                self._close(ident)

    def _replaced(self, key: str) -> None:
        """Drop the mappings of objects that went by ``key`` before the one just mapped."""
        for ident, (named, _) in list(self._maps.items()):
            if named == key:
                self._close(ident)

    def _evict(self) -> None:
        while len(self._maps) > 1 and sum(len(m) for _, m in self._maps.values()) > self.limit:
            self._close(next(iter(self._maps)))

    def _close(self, ident: tuple[int, int]) -> None:
        _, mapped = self._maps.pop(ident)
        with contextlib.suppress(BufferError):  # a live array still uses it: freed with it
            mapped.close()


MAPPINGS = Mappings()


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
            raise BadInput(
                f"shared memory region '{slot.region}' is smaller than its registered size"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def read(slot: Slot) -> memoryview:
    """The slot's bytes, read-only (see the module docstring)."""
    if slot.size == 0:
        return memoryview(b"")
    return MAPPINGS.view(slot).toreadonly()


def read_input(table: Table | None, tensor: dict[str, Any], has_data: bool) -> Any:
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
    MAPPINGS.forget_unnamed(table)
    if slot.device is not None:
        from . import cuda_shm  # torch: only in a worker that is sent a CUDA region

        slot = tensor[SLOT] = cuda_shm.bind(slot, table)
        return cuda_shm.read_input(slot, tensor["datatype"], list(tensor["shape"]), name)
    return oip_binary.from_binary(read(slot), tensor["datatype"], list(tensor["shape"]), name)


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
    MAPPINGS.forget_unnamed(table)
    if slot.device is not None:
        from . import cuda_shm

        slot = cuda_shm.bind(slot, table)
    output[SLOT] = slot


def release_unnamed(table: Table | None) -> None:
    """Let go of the mappings and CUDA handles no region of ``table`` names any more (called for
    every v2 request, which carries the current table: a region unregistered is let go at the
    worker's next request, not only at its next request that names a region)."""
    MAPPINGS.forget_unnamed(table)
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
        MAPPINGS.view(Slot(slot.region, slot.key, slot.start, len(data)))[:] = data
