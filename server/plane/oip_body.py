"""An Open Inference Protocol body as the plane reads it for the request's own ``parameters``
(``sequence_params.py``: the sequence; ``schedule.py``: priority and timeout).

A body sent with a ``Content-Encoding`` (gzip or deflate: Triton's HTTP endpoint takes both, and
the worker inflates them, ``handlers/runtime/oip_encoding.py``) is inflated here first, else its
parameters would be unreadable: a sequence model refused every compressed request as "not valid
JSON", and a compressed request's priority and timeout were ignored. Inflating is bounded as in
the worker: never more than ``limit`` bytes (the server's ``max_request_size``), a body past it
is a 413. The worker's inflater is not imported (``handlers`` is the worker's), so this is its
short twin; the worker still inflates and checks the body it is sent. Torch-free.
"""

from __future__ import annotations

import zlib

from torchbay.server.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType
from torchbay.server.serving import protocol as p

DEFAULT_LIMIT = 6553500  # TorchServe's default max_request_size
_HEADER = "content-encoding"
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def encoding_of(wire: p.WireRequest) -> str | None:
    """The request's ``Content-Encoding`` (None without one); a byte search for most bodies."""
    if wire.raw_headers:
        if _HEADER.encode() not in wire.raw_headers:
            return None
        return p.parse_headers(wire.raw_headers).get(_HEADER)
    return wire.headers.get(_HEADER)


def inflated(wire: p.WireRequest, limit: int = DEFAULT_LIMIT) -> bytes:
    """``wire.body`` with its content codings undone (unchanged without one): 415 for a coding
    other than gzip, deflate and identity (the worker's answer too), 400 for data that does not
    inflate, 413 for a body that inflates past ``limit`` bytes."""
    return decoded(wire.body, encoding_of(wire), limit)


def decoded(body: bytes, encoding: str | None, limit: int = DEFAULT_LIMIT) -> bytes:
    """``body`` with the content codings of ``encoding`` undone, as :func:`inflated` (for a
    body the frontend reads itself: KServe v1's instances)."""
    codings = [c.strip().lower() for c in (encoding or "").split(",") if c.strip()]
    for coding in reversed(codings):  # the last coding applied is listed last
        if coding == "identity":
            continue
        if coding not in _WBITS:
            raise UnsupportedMediaType(f"unsupported Content-Encoding {coding!r}")  # as the worker
        body = _inflate(body, coding, limit)
    return body


def _inflate(body: bytes, coding: str, limit: int) -> bytes:
    # "deflate" is the zlib format; some clients send a raw deflate stream for it
    tries = (_WBITS[coding], -zlib.MAX_WBITS) if coding == "deflate" else (_WBITS[coding],)
    for wbits in tries:
        inflater = zlib.decompressobj(wbits)
        try:
            out = inflater.decompress(body, limit + 1)  # never more than one byte past
        except zlib.error:
            continue
        if len(out) > limit:
            raise PayloadTooLarge(f"the decompressed body is larger than {limit} bytes")
        if inflater.eof and not inflater.unused_data:
            return out
    raise BadRequest(f"body is not valid {coding} data")
