"""Tensors in the clients' system shared-memory regions, as the worker reads and writes them.

Triton's shared-memory extension (``server/plane/shm.py`` is the server's registry): an input or
a requested output whose ``parameters`` name a ``shared_memory_region`` (with
``shared_memory_byte_size`` and an optional ``shared_memory_offset``) has its bytes in that
region, never in the request or the response. The frontend hands each request the table of
registered regions (``WireRequest.regions``: ``{name: [key, offset, byte_size]}``); here
:func:`locate` checks a tensor's parameters against it (Triton's messages, 400), :func:`read`
maps an input's bytes and :func:`write` puts an output's bytes into the client's region.

Inputs are mapped, not copied: a private copy-on-write mapping (``MAP_PRIVATE``) of the object
opened read-only, so the tensor is the client's memory until a handler writes into it, and a
handler that does write changes its own pages, never the client's region. Each request maps
what it uses and the mapping goes with its last array, so a region the client unregisters (and
unlinks) between two requests is never read stale. Outputs are written with ``pwrite`` at the
region's offset, one copy from the result (Triton copies too). The object's size is checked
before either: a region that shrank is a 400, not a fault. A client that shrinks its object while
a request is reading it can still fault the worker (as with any ``mmap``; the worker is then
restarted and the request answered 503). Torch-free.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BadInput
from . import oip_binary

SHM_DIR = "/dev/shm"
SLOT = "shm_slot"  # the key of a parsed request's output entry that sits in a region
Table = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Slot:
    """``size`` bytes at ``start`` of the object ``key``, the part of ``region`` a tensor uses."""

    region: str
    key: str
    start: int
    size: int


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
    key, base, byte_size = entry
    if offset >= byte_size:
        raise BadInput(f"Invalid offset for shared memory region: '{region}'")
    if offset + size > byte_size:
        raise BadInput(f"Invalid offset + byte size for shared memory region: '{region}'")
    return Slot(region, str(key), int(base) + offset, size)


def _open(slot: Slot, flags: int) -> int:
    """The region's object, opened; checked to still hold the slot's bytes."""
    path = os.path.join(SHM_DIR, slot.key.lstrip("/"))
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
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
    """The slot's bytes, mapped copy-on-write (see the module docstring)."""
    if slot.size == 0:
        return memoryview(b"")
    fd = _open(slot, os.O_RDONLY)
    try:
        first = slot.start - slot.start % mmap.ALLOCATIONGRANULARITY
        mapped = mmap.mmap(
            fd, slot.start + slot.size - first, access=mmap.ACCESS_COPY, offset=first
        )
    finally:
        os.close(fd)
    skip = slot.start - first
    return memoryview(mapped)[skip : skip + slot.size]


def read_input(table: Table | None, tensor: dict[str, Any], has_data: bool) -> np.ndarray:
    """The array of an input in a region (Triton's rule: one of ``data``, ``binary_data_size``
    or ``shared_memory_region``)."""
    name, params = tensor["name"], tensor.get("parameters") or {}
    if has_data or "binary_data_size" in params:
        both = "'data'" if has_data else "'binary_data_size'"
        raise BadInput(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            f"'parameters', 'shared_memory_region' in 'parameters'. But set {both} "
            "'shared_memory_region'"
        )
    slot = locate(table, params, f"input {name!r}")
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
    output[SLOT] = locate(table, params, f"output {output['name']!r}")


def write(slot: Slot, array: np.ndarray, datatype: str, name: str) -> None:
    """Put an output's bytes (the binary tensor data layout) into its slot."""
    if datatype in ("BYTES", "BF16") or not array.flags.c_contiguous:
        data = memoryview(oip_binary.to_binary(array, datatype))
    else:
        data = memoryview(np.ascontiguousarray(array, oip_binary.NUMPY_DTYPES[datatype]))
    data = data.cast("B")
    if len(data) > slot.size:
        raise BadInput(
            f"shared memory size specified with the request for output '{name}' "
            f"({slot.size} bytes) should be at least {len(data)} bytes to hold the results"
        )
    fd = _open(slot, os.O_RDWR)
    try:
        done = 0
        while done < len(data):
            done += os.pwrite(fd, data[done:], slot.start + done)
    finally:
        os.close(fd)
