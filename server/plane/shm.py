"""Triton's shared-memory extensions: the server's registry of the clients' memory regions.

A client creates a POSIX shared-memory object (``shm_open``; on Linux a file under
``/dev/shm``), registers a region of it by name (``key``, ``offset``, ``byte_size``), then names
the region in an inference request's input or output ``parameters``
(``shared_memory_region``, ``shared_memory_offset``, ``shared_memory_byte_size``): the tensor's
bytes never travel over the socket. One registry per server, for every protocol (HTTP and gRPC
call the same :class:`SharedMemory`); the names share one namespace across system and CUDA
regions, as Triton's do.

The frontend never maps a region nor copies its bytes: registration checks that the object
exists, can be opened read-write and is large enough (``fstat``), and each request carries the
entries of the registered regions its JSON names (:meth:`SharedMemory.table_for`) to the
worker, which reads and writes the object itself, through its file and never a mapping
(``handlers/runtime/shm.py``: a client that shrinks or removes its object, even during a
request, gets a 400 and never faults the worker). A region unregistered while requests carry it
stays, as Triton's does (listed, usable, its name taken), until the last of them is answered
(:meth:`SharedMemory.hold` at admission, :meth:`SharedMemory.release` when the exchange closes).

As Triton (``--allow-client-shm``), clients may use shared memory only when the operator allows
it (``allow_client_shm``): a client that registers a region makes the server read from, and
write into, a memory object of the server's host, so it is off by default (then registering
and unregistering are Triton's UNSUPPORTED: 501, gRPC UNIMPLEMENTED; status lists no region).
Bounded: at most ``max_regions`` regions and ``max_bytes`` registered bytes in all, system and
CUDA together.

CUDA shared memory: the client allocates device memory, exports it as a ``cudaIpcMemHandle_t``
(64 opaque bytes; base64 over REST) and registers it with its ``device_id`` and ``byte_size``.
The frontend cannot check the handle (it holds no CUDA context, and keeps torch out): it checks
the handle's length and that ``device_id`` is one of the server's GPUs (``cuda_devices``, the
GPUs the workers are placed on), and carries the handle to the worker, which opens it once
(``handlers/runtime/cuda_shm.py``). Once a CUDA region is gone (unregistered, and no request
holds it) ``cuda_gone`` is told the CUDA regions left, so that the workers close its handle
then, as Triton does at unregister: an open handle keeps the client's allocation alive. A server
without a GPU refuses the registration with the reason, and does not advertise
``cuda_shared_memory``. Torch-free.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from torchbay.server.errors import AlreadyExists, BadRequest, NotFound, Unsupported
from torchbay.server.plane import oip_body
from torchbay.server.plane.schedule import json_header
from torchbay.server.serving import protocol as p

Kind = Literal["system", "cuda"]
SHM_DIR = "/dev/shm"  # where Linux's shm_open keeps its objects
MAX_NAME = 256
MAX_KEY = 255  # NAME_MAX
IPC_HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)
# Prefixes of objects that are not the clients' to hand out: Triton's Python backend's, and the
# ones torch's multiprocessing creates for tensors shared between processes.
RESERVED_PREFIXES = ("triton_python_backend_shm_region_", "torch_")
# A region named in an OIP request's JSON: the name's JSON string, escapes and all.
_NAMED = re.compile(rb'"shared_memory_region"\s*:\s*("(?:[^"\\]|\\.)*")')
# Triton's words (src/common.h kClientShmDisabledErrorStr), with its status: UNSUPPORTED.
DISABLED = (
    "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
)


@dataclass(frozen=True, slots=True)
class Region:
    """One registered region: ``byte_size`` bytes at ``offset`` of the object ``key`` (system),
    or of the device memory whose IPC handle is ``key`` (cuda: the handle in base64, on GPU
    ``device_id``)."""

    name: str
    kind: Kind
    key: str = ""
    offset: int = 0
    byte_size: int = 0
    device_id: int = 0

    def status(self) -> dict[str, Any]:
        """Triton's status entry for the region."""
        if self.kind == "system":
            return {
                "name": self.name,
                "key": self.key,
                "offset": self.offset,
                "byte_size": self.byte_size,
            }
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}

    def carried(self) -> list[Any]:
        """The region as a request carries it to the worker: ``[key, offset, byte_size]``, and
        for a CUDA region its device after them (the worker tells the kinds apart by it)."""
        if self.kind == "system":
            return [self.key, self.offset, self.byte_size]
        return [self.key, self.offset, self.byte_size, self.device_id]


class SharedMemory:
    """The registered regions of one server (see the module docstring)."""

    def __init__(
        self,
        *,
        allow: bool = False,
        max_regions: int = 64,
        max_bytes: int = 16 << 30,
        shm_dir: str = SHM_DIR,
        cuda_devices: int = 0,
    ) -> None:
        self.allow = allow
        self.cuda_devices = cuda_devices  # GPUs of this server (serve.py); 0: no CUDA regions
        self.max_regions = max_regions
        self.max_bytes = max_bytes
        self.shm_dir = shm_dir
        self._regions: dict[str, Region] = {}
        self._table: dict[str, list[Any]] | None = None  # what requests carry; None: no region
        self._cuda: dict[str, list[Any]] = {}  # its CUDA regions, carried by every request
        self._uses: dict[str, int] = {}  # requests in flight that carry each region (held)
        self._leaving: set[str] = set()  # unregistered while in use: gone when the last lets go
        # Told the CUDA regions left ({name: carried}) when one is gone (the plane's workers).
        self.cuda_gone: Callable[[dict[str, list[Any]]], None] | None = None

    # -- status, register, unregister ------------------------------------------------------------

    def status(self, kind: Kind, name: str | None = None) -> list[dict[str, Any]]:
        """Every region of ``kind``, or the one named (404, gRPC NOT_FOUND, when there is none of
        that kind: Triton's TRITONSERVER_ERROR_NOT_FOUND)."""
        if not name:
            return [r.status() for r in self._regions.values() if r.kind == kind]
        region = self._regions.get(name)
        if region is None:
            label = "system" if kind == "system" else "cuda"
            raise NotFound(f"Unable to find {label} shared memory region: '{name}'")
        if region.kind != kind:
            raise NotFound(
                f"The region named '{name}' is registered as {_label(region.kind)} shared "
                f"memory, not {_label(kind)} shared memory"
            )
        return [region.status()]

    def register_system(self, name: str, key: Any, offset: Any, byte_size: Any) -> Region:
        """Register ``byte_size`` bytes at ``offset`` of the POSIX shared-memory object ``key``.
        501 (gRPC UNIMPLEMENTED) when client shared memory is off; 400 when the name is taken,
        the arguments are wrong, the object cannot be opened read-write or is smaller than
        ``offset + byte_size``, or a limit would be passed."""
        self._may_register(name)
        _given(key=key, byte_size=byte_size)
        key = _key(name, key)
        offset = _size(name, "offset", offset, minimum=0)
        byte_size = _size(name, "byte_size", byte_size, minimum=1)
        self._within_limits(name, byte_size)
        _check_object(name, os.path.join(self.shm_dir, key.lstrip("/")), key, offset + byte_size)
        region = Region(name, "system", key, offset, byte_size)
        self._regions[name] = region
        self._table = None
        return region

    def register_cuda(self, name: str, raw_handle: Any, device_id: Any, byte_size: Any) -> Region:
        """Register ``byte_size`` bytes of device memory on GPU ``device_id``, exported by the
        client as ``raw_handle`` (the 64 bytes of a ``cudaIpcMemHandle_t``: raw over gRPC,
        ``{"b64": ...}`` over REST). 400 when client shared memory is off, this server has no
        GPU, the name is taken, the arguments are wrong or a limit would be passed (501 when client
        shared memory is off). Whether the
        handle opens is known in the worker, at the first request that uses it."""
        self._may_register(name)
        _given(raw_handle=raw_handle)
        if self.cuda_devices < 1:
            raise BadRequest(
                f"failed to register CUDA shared memory region '{name}': this server has no "
                "CUDA device (no GPU is visible to it); use system shared memory"
            )
        handle = _ipc_handle(name, raw_handle)
        device_id = _size(name, "device_id", device_id, minimum=0)
        if device_id >= self.cuda_devices:
            raise BadRequest(
                f"failed to register CUDA shared memory region '{name}': device_id {device_id} "
                f"is not one of this server's {self.cuda_devices} GPUs"
            )
        byte_size = _size(name, "byte_size", byte_size, minimum=1)
        self._within_limits(name, byte_size)
        key = base64.b64encode(handle).decode("ascii")
        region = Region(name, "cuda", key, 0, byte_size, device_id)
        self._regions[name] = region
        self._table = None
        return region

    def offers(self, extension: str) -> bool:
        """Whether the server advertises a shared-memory ``extension``: only when clients may
        use it (``allow``), and CUDA's only with a GPU."""
        if extension == "system_shared_memory":
            return self.allow
        if extension == "cuda_shared_memory":
            return self.allow and self.cuda_devices > 0
        return True

    def unregister(self, kind: Kind, name: str | None = None) -> None:
        """Forget the region named, or every region of ``kind``; a name that is not registered
        (or is of the other kind) is not an error, as in Triton; 501 when client shared memory
        is off. A region that requests in flight carry stays (listed, usable, its name taken)
        until the last of them lets it go (:meth:`release`), as Triton's does."""
        if not self.allow:
            raise Unsupported(DISABLED)
        names = [name] if name else list(self._regions)
        gone = []
        for n in names:
            region = self._regions.get(n)
            if region is None or region.kind != kind:
                continue
            if self._uses.get(n):
                self._leaving.add(n)
            else:
                gone.append(n)
        self._drop(gone)

    def hold(self, wire: p.WireRequest) -> tuple[dict[str, list[Any]] | None, tuple[str, ...]]:
        """:meth:`table_for` ``wire``, and the regions its JSON names, held until
        :meth:`release` of those names (a CUDA region it carries but does not name, or any
        region of a body not read plainly, is not held: every request would hold them)."""
        table, named = self._pick(wire)
        for name in named:
            self._uses[name] = self._uses.get(name, 0) + 1
        return table, named

    def release(self, names: tuple[str, ...]) -> None:
        """A request that :meth:`hold` gave ``names`` is done: a region unregistered meanwhile
        goes once no request holds it."""
        gone = []
        for name in names:
            left = self._uses.pop(name, 1) - 1
            if left > 0:
                self._uses[name] = left
            elif name in self._leaving:
                self._leaving.discard(name)
                gone.append(name)
        self._drop(gone)

    def _drop(self, names: list[str]) -> None:
        """The regions ``names`` are gone; if one was CUDA's, the workers are told once (its
        handle is let go in every worker)."""
        if not names:
            return
        dropped = [self._regions.pop(name, None) for name in names]
        self._table = None
        if self.cuda_gone is not None and any(r is not None and r.kind == "cuda" for r in dropped):
            left = {r.name: r.carried() for r in self._regions.values() if r.kind == "cuda"}
            self.cuda_gone(left)

    # -- what a request carries ------------------------------------------------------------------

    def table(self) -> dict[str, list[Any]] | None:
        """The registered regions as a request carries them to its worker:
        ``{name: Region.carried()}``; None while there are none (requests then carry nothing,
        and a region they name is unknown to the worker)."""
        if self._table is None and self._regions:
            self._table = {r.name: r.carried() for r in self._regions.values()}
            self._cuda = {
                r.name: self._table[r.name] for r in self._regions.values() if r.kind == "cuda"
            }
        return self._table or None

    def table_for(self, wire: p.WireRequest) -> dict[str, list[Any]] | None:
        """What ``wire`` carries of :meth:`table`: the regions its JSON names, and every CUDA
        region (the worker keeps a CUDA handle open while a request's table names it). Each
        entry costs every request that carries it, so a request naming no region carries none
        but those: 4096 regions made each v2 request ~5x slower, whatever it named. A body
        the frontend cannot read plainly (compressed, or with a ``\\u`` escape that may spell
        the name or the key) carries the whole table, as before."""
        return self._pick(wire)[0]

    def _pick(self, wire: p.WireRequest) -> tuple[dict[str, list[Any]] | None, tuple[str, ...]]:
        """:meth:`table_for` ``wire``, and the registered regions its JSON plainly names."""
        table = self.table()
        if table is None or oip_body.encoding_of(wire) is not None:
            return table, ()
        if wire.raw_headers.count(b"inference-header-content-length") > 1:
            return table, ()  # which JSON the worker reads is its business (the last length)
        head = json_header(wire)
        if b"\\u" in head:
            return table, ()
        try:
            named = {json.loads(m) for m in _NAMED.findall(head)}
        except ValueError:  # an escape JSON has not: the worker answers the request's 400
            return table, ()
        picked = {n: table[n] for n in named if n in table}
        return {**self._cuda, **picked} or None, tuple(picked)

    # -- checks ------------------------------------------------------------------------------------

    def _may_register(self, name: str) -> None:
        if not self.allow:
            raise Unsupported(DISABLED)
        if not name or len(name) > MAX_NAME:
            raise BadRequest(
                f"'region name' is necessary to register shared memory region (1 to {MAX_NAME} "
                "characters)"
            )
        if name in self._regions:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")

    def _within_limits(self, name: str, byte_size: int) -> None:
        if len(self._regions) >= self.max_regions:
            raise BadRequest(
                f"failed to register shared memory region '{name}': the server holds at most "
                f"{self.max_regions} regions (shm_max_regions); unregister one first"
            )
        used = sum(r.byte_size for r in self._regions.values())
        if used + byte_size > self.max_bytes:
            raise BadRequest(
                f"failed to register shared memory region '{name}': {byte_size} bytes would "
                f"pass the server's {self.max_bytes}-byte limit on registered regions "
                f"(shm_max_bytes; {used} bytes registered)"
            )


def _given(**fields: Any) -> None:
    """Triton's words for a REST register body without a field it needs (gRPC's have them all)."""
    for field, value in fields.items():
        if value is None:
            raise BadRequest(f"Shared memory register request has no '{field}' field")


def _label(kind: Kind) -> str:
    return "system" if kind == "system" else "CUDA"


def _key(name: str, key: Any) -> str:
    """A POSIX shared-memory object name: one path component after an optional ``/``."""
    bare = key.lstrip("/") if isinstance(key, str) else ""
    bad = not bare or len(bare) > MAX_KEY or "/" in bare or "\x00" in bare or bare in (".", "..")
    if bad:
        raise BadRequest(f"cannot register shared memory region '{name}' - invalid shm key {key!r}")
    if bare.startswith(RESERVED_PREFIXES):
        raise BadRequest(
            f"cannot register shared memory region '{name}' with key '{key}' as the key "
            f"contains a reserved prefix ({', '.join(RESERVED_PREFIXES)})"
        )
    return key


def _ipc_handle(name: str, raw: Any) -> bytes:
    """The 64 bytes of a ``cudaIpcMemHandle_t``: given raw (gRPC) or as ``{"b64": ...}`` (REST)."""
    if isinstance(raw, dict):
        text = raw.get("b64")
        try:
            raw = base64.b64decode(text, validate=True) if isinstance(text, str) else None
        except (binascii.Error, ValueError):
            raw = None
    if not isinstance(raw, bytes) or len(raw) != IPC_HANDLE_BYTES:
        raise BadRequest(
            f"failed to register CUDA shared memory region '{name}': raw_handle must be the "
            f"{IPC_HANDLE_BYTES} bytes of a cudaIpcMemHandle_t (base64 in 'b64' over REST)"
        )
    return raw


def _size(name: str, field: str, value: Any, *, minimum: int) -> int:
    """``value`` as a size: an integer from ``minimum`` to 2**63 - 1 (gRPC's are uint64: a
    client's -1 arrives as 2**64 - 1, which the message shows)."""
    if type(value) is not int or value < minimum or value >= 1 << 63:
        raise BadRequest(
            f"failed to register shared memory region '{name}': {field} must be an integer "
            f"from {minimum} to {(1 << 63) - 1}, not {str(value)[:32]}"
        )
    return value


def _check_object(name: str, path: str, key: str, needed: int) -> None:
    """The object opens read-write (outputs are written into it), is a regular shared-memory
    object (never a link), and holds ``needed`` bytes."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        raise BadRequest(f"Unable to open shared memory region: '{key}'") from None
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(info.st_mode):
        raise BadRequest(f"Invalid shared memory region: '{key}'")
    if info.st_size < needed:
        raise BadRequest(f"failed to register shared memory region '{name}': invalid args")
