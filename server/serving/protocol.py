"""The frontend <-> worker protocol. This module owns every byte that crosses the worker socket
(``transport.py`` reads and writes the frames it makes).

A frame is::

    u32 length | u8 kind | u32 header_length | header (JSON, UTF-8) | blob 0 | blob 1 | ...

``length`` counts everything after itself. The header is a JSON object of the message's fields;
byte payloads (request and response bodies) travel as raw blobs after it, and the header's
``"_blobs"`` list gives their sizes in order, so bodies are never base64'd or JSON-escaped.
Anything malformed raises :class:`ProtocolError`. Torch-free: the frontend imports this.

One request shape from the listener to the worker and back: every listener (the inference app,
KServe v1/v2, and the gRPC or streaming listeners to come) builds a :class:`WireRequest`; every
worker answers exactly one :class:`WireResponse` per request. Between them the queue only wraps
the request in a ``serving.queue.Pending`` (its future and timestamps, never a new shape), and
``Infer``/``Result`` carry lists of them. The worker hands the ``WireRequest``s to the handler
service as they are (``handlers.runtime.service.RequestLike`` is what it reads of them).

Streaming: while a batch runs, the worker may send any number of ``Part`` frames (one partial
response of one request: TorchServe's ``send_intermediate_predict_response``, or an item a
handler's generator yielded) before the batch's ``Result``, which ends every request's stream.
The frontend may send ``Cancel`` for a request of the running batch (its client went away); the
worker then stops producing for it (see ``handlers.streaming``) and still answers it in the
``Result``.
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

_PREFIX = struct.Struct("!IBI")  # length, kind, header_length
_LENGTH = struct.Struct("!I")
MAX_FRAME = 1 << 31  # 2 GiB: the u32 length's practical ceiling


class ProtocolError(Exception):
    """A frame that does not parse, or a message that does not fit the protocol."""


class Kind(enum.IntEnum):
    LOAD = 1
    READY = 2
    LOAD_FAILED = 3
    INFER = 4
    RESULT = 5
    SHUTDOWN = 6
    TUNE = 7
    PART = 8
    CANCEL = 9
    REGIONS = 10


@dataclass(frozen=True, slots=True)
class Load:
    """Frontend -> worker, first message: load this model onto this device. It is the launch
    spec serialized: each field is the ``LaunchSpec`` (or ``Placement``) field of its name."""

    kind: ClassVar[Kind] = Kind.LOAD
    model_dir: str
    model_name: str
    model_version: str
    batch_size: int
    gpu_id: int | None = None  # None: CPU
    handler: str | None = None  # overrides the manifest's handler (management API)
    num_threads: int = 1
    cpu_affinity: list[int] | None = None  # cores to pin the worker to
    server_version: str = ""
    limit_max_image_pixels: bool = True
    max_request_size: int = 6553500  # caps a decompressed (Content-Encoding) request body
    max_response_size: int = 0  # a response past it is answered 500 by the worker (0: none)
    decode_input_request: bool = True  # TorchServe's: JSON and text bodies reach handlers decoded
    model_metrics: list[Any] | None = None  # [name, kind, unit, [dimensions]] per model metric
    sequence_headers: list[str] | None = None  # id, start, end (None: TorchServe's names)
    blacklist_env_vars: str = ""  # variables (a regex, whole names) the handler must not see


@dataclass(frozen=True, slots=True)
class Ready:
    """Worker -> frontend: the model is loaded and the worker takes batches."""

    kind: ClassVar[Kind] = Kind.READY
    pid: int
    device: str
    load_time_ms: float
    num_threads: int
    torch_version: str = ""
    metrics: list[Any] | None = None  # the handler's metric records made while it loaded
    metrics_spill: str = ""  # the worker's metrics spill file (serving.spill), "" for none


@dataclass(frozen=True, slots=True)
class LoadFailed:
    kind: ClassVar[Kind] = Kind.LOAD_FAILED
    error_type: str
    message: str


@dataclass(frozen=True, slots=True)
class WireRequest:
    """One request as the worker sees it. The frontend fills ``raw_headers`` (HTTP header lines,
    ``name: value`` joined by CRLF, names lower-case) and never decodes them; the worker's
    decoded view is ``headers``."""

    request_id: str
    body: bytes
    content_type: str = ""
    headers: dict[str, str] = field(default_factory=dict)  # lower-cased names
    query: str = ""  # raw query string; TorchServe passes its parameters to the handler
    protocol: str = "predict"  # "predict" (TorchServe) | "v2" (Open Inference Protocol)
    raw_headers: bytes = b""
    # The server's registered system shared-memory regions, {name: [key, offset, byte_size]},
    # for a v2 request that may name one (server/plane/shm.py); None: no region registered.
    regions: dict[str, list[Any]] | None = None
    max_batch: int = 0  # a v2 request's largest batch dimension (Triton's max_batch_size); 0: any


def join_headers(pairs: Iterable[tuple[bytes, bytes]]) -> bytes:
    """ASGI header pairs as CRLF-separated ``name: value`` lines (the wire form)."""
    return b"\r\n".join([name + b": " + value for name, value in pairs])


def parse_headers(raw: bytes) -> dict[str, str]:
    """The inverse of ``join_headers`` (latin-1, as HTTP/1.1 headers are); last one wins."""
    headers: dict[str, str] = {}
    if not raw:
        return headers
    for line in raw.split(b"\r\n"):
        name, sep, value = line.partition(b": ")
        if not sep:
            raise ProtocolError(f"malformed header line {line[:40]!r}")
        headers[name.decode("latin-1")] = value.decode("latin-1")
    return headers


@dataclass(frozen=True, slots=True)
class WireResponse:
    """One response, or with ``partial`` one intermediate part of a streamed response (more
    parts, and the request's final response, follow)."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    partial: bool = False


@dataclass(frozen=True, slots=True)
class Infer:
    kind: ClassVar[Kind] = Kind.INFER
    batch_id: int
    requests: list[WireRequest]


@dataclass(frozen=True, slots=True)
class Result:
    """Worker -> frontend: exactly one response per request of batch ``batch_id``, in order."""

    kind: ClassVar[Kind] = Kind.RESULT
    batch_id: int
    responses: list[WireResponse]
    timings: dict[str, float] = field(default_factory=dict)  # stage -> milliseconds
    metrics: list[dict[str, Any]] = field(default_factory=list)  # custom handler metrics
    handled: int | None = None  # the requests the handler ran (None: all of them)


@dataclass(frozen=True, slots=True)
class Part:
    """Worker -> frontend, while batch ``batch_id`` runs: one intermediate part of one request's
    response (the first part's status, content type and headers are the response's)."""

    kind: ClassVar[Kind] = Kind.PART
    batch_id: int
    request_id: str
    response: WireResponse


@dataclass(frozen=True, slots=True)
class Cancel:
    """Frontend -> worker, while a batch runs: the client of ``request_id`` is gone."""

    kind: ClassVar[Kind] = Kind.CANCEL
    request_id: str


@dataclass(frozen=True, slots=True)
class Shutdown:
    kind: ClassVar[Kind] = Kind.SHUTDOWN


@dataclass(frozen=True, slots=True)
class Tune:
    """Frontend -> worker, between batches: change torch's intra-op threads (after scaling)."""

    kind: ClassVar[Kind] = Kind.TUNE
    num_threads: int
    cpu_affinity: list[int] | None = None  # None: the cores the worker started with


@dataclass(frozen=True, slots=True)
class Regions:
    """Frontend -> worker, after a CUDA shared-memory region was unregistered: the CUDA regions
    still registered (``{name: [handle, offset, byte_size, device]}``); the worker closes the
    handles it opened that none of them names, at once or after its running batch."""

    kind: ClassVar[Kind] = Kind.REGIONS
    cuda: dict[str, list[Any]]


Message = Load | Ready | LoadFailed | Infer | Result | Part | Cancel | Shutdown | Tune | Regions


# -- encoding ---------------------------------------------------------------------------------


def encode(message: Message) -> bytes:
    """Serialise one message into one frame."""
    blobs: list[bytes] = []
    if isinstance(message, Infer):
        header: dict[str, Any] = {
            "batch_id": message.batch_id,
            "requests": [
                [r.request_id, r.content_type, r.query, r.protocol, r.regions, r.max_batch]
                for r in message.requests
            ],
        }
        for r in message.requests:  # two blobs a request: its header lines, then its body
            raw = r.raw_headers or join_headers(  # "?" for what Latin-1 lacks, as HTTP's are
                (k.encode("latin-1", "replace"), v.encode("latin-1", "replace"))
                for k, v in r.headers.items()
            )
            blobs += (raw, r.body)
    elif isinstance(message, Result):
        header = {
            "batch_id": message.batch_id,
            "responses": [[r.status, r.content_type, r.headers] for r in message.responses],
            "timings": message.timings,
            "metrics": message.metrics,
            "handled": message.handled,
        }
        blobs = [r.body for r in message.responses]
    elif isinstance(message, Part):
        r = message.response
        header = {
            "batch_id": message.batch_id,
            "request_id": message.request_id,
            "response": [r.status, r.content_type, r.headers],
        }
        blobs = [r.body]
    else:
        header = asdict(message)
    if blobs:
        header["_blobs"] = [len(b) for b in blobs]
    head = json.dumps(header, separators=(",", ":")).encode()
    total = 1 + 4 + len(head) + sum(len(b) for b in blobs)
    if total >= MAX_FRAME:
        raise ProtocolError(f"frame of {total} bytes exceeds the {MAX_FRAME}-byte limit")
    return b"".join([_PREFIX.pack(total, message.kind, len(head)), head, *blobs])


def decode(kind: int, payload: memoryview | bytes) -> Message:
    """Parse a frame's body (everything after the length prefix and kind byte)."""
    try:
        kind = Kind(kind)
    except ValueError:
        raise ProtocolError(f"unknown message kind {kind}") from None
    view = memoryview(payload)
    if len(view) < 4:
        raise ProtocolError("frame too short for its header length")
    (head_len,) = _LENGTH.unpack_from(view)
    if 4 + head_len > len(view):
        raise ProtocolError("header length runs past the frame")
    try:
        header = json.loads(bytes(view[4 : 4 + head_len]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError("header is not a JSON object")
    blobs = _split_blobs(header.pop("_blobs", []), view[4 + head_len :])
    try:
        return _build(kind, header, blobs)
    except (TypeError, ValueError, KeyError, IndexError) as exc:
        raise ProtocolError(f"malformed {kind.name} message: {exc}") from None


def _split_blobs(sizes: Any, rest: memoryview) -> list[bytes]:
    if not isinstance(sizes, list) or not all(isinstance(n, int) and n >= 0 for n in sizes):
        raise ProtocolError("_blobs must be a list of sizes")
    if sum(sizes) != len(rest):
        raise ProtocolError(f"blob sizes add up to {sum(sizes)}, frame carries {len(rest)}")
    blobs, offset = [], 0
    for n in sizes:
        blobs.append(bytes(rest[offset : offset + n]))
        offset += n
    return blobs


def _build(kind: Kind, header: dict[str, Any], blobs: list[bytes]) -> Message:
    if kind is Kind.INFER:
        items = header["requests"]
        if 2 * len(items) != len(blobs):
            raise ProtocolError("INFER: header lines and a body per request expected")
        pairs = zip(blobs[0::2], blobs[1::2], strict=True)  # (header lines, body) per request
        requests = [
            WireRequest(
                str(rid),
                body,
                str(ctype),
                parse_headers(raw),
                str(query),
                str(proto),
                regions=_regions(shm),
                max_batch=int(cap),
            )
            for (rid, ctype, query, proto, shm, cap), (raw, body) in zip(items, pairs, strict=True)
        ]
        return Infer(batch_id=int(header["batch_id"]), requests=requests)
    if kind is Kind.RESULT:
        items = header["responses"]
        if len(items) != len(blobs):
            raise ProtocolError("RESULT: one body per response expected")
        responses = [
            WireResponse(int(status), body, str(ctype), dict(headers))
            for (status, ctype, headers), body in zip(items, blobs, strict=True)
        ]
        timings, metrics = dict(header.get("timings") or {}), list(header.get("metrics") or [])
        handled = header.get("handled")
        return Result(int(header["batch_id"]), responses, timings, metrics, handled)
    if kind is Kind.PART:
        if len(blobs) != 1:
            raise ProtocolError("PART: one body expected")
        status, ctype, headers = header["response"]
        response = WireResponse(int(status), blobs[0], str(ctype), _str_dict(headers), True)
        return Part(int(header["batch_id"]), str(header["request_id"]), response)
    if blobs:
        raise ProtocolError(f"{kind.name} carries no blobs")
    if kind is Kind.REGIONS:
        return Regions(_regions(header["cuda"]) or {})
    cls = {
        Kind.LOAD: Load,
        Kind.READY: Ready,
        Kind.LOAD_FAILED: LoadFailed,
        Kind.SHUTDOWN: Shutdown,
        Kind.TUNE: Tune,
        Kind.CANCEL: Cancel,
    }[kind]
    return cls(**header)


def _regions(value: Any) -> dict[str, list[Any]] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(v, list) for v in value.values()):
        raise ProtocolError("regions must be a JSON object of lists")
    return value


def _str_dict(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ProtocolError("headers must be a JSON object")
    return {str(k): str(v) for k, v in value.items()}
