"""HTTP content codings in the worker: ``Content-Encoding`` request bodies and ``Accept-Encoding``
responses (gzip and deflate, as Triton's HTTP endpoint does).

Torch-free. A compressed request body is inflated in bounded steps (``zlib.decompressobj`` with
``max_length``): it never allocates more than the cap (the server's ``max_request_size``), and a
body that would inflate past it is a 413. ``deflate`` is the zlib format
(RFC 9110; what tritonclient sends); a raw deflate stream is accepted too.
"""

from __future__ import annotations

import zlib

from ..errors import BadInput, PredictionException

DEFAULT_MAX_SIZE = 6553500  # TorchServe's default max_request_size
_CHUNK = 1 << 20
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def decode_content(body: bytes, encoding: str | None, max_size: int) -> bytes:
    """``body`` with its Content-Encoding undone (``identity`` or none: unchanged)."""
    codings = [c.strip().lower() for c in (encoding or "").split(",") if c.strip()]
    for coding in reversed(codings):  # the last coding applied is listed last
        if coding == "identity":
            continue
        if coding not in _WBITS:
            raise PredictionException(f"unsupported Content-Encoding {coding!r}", 415)
        try:
            body = _inflate(body, _WBITS[coding], max_size)
        except zlib.error as exc:
            if coding != "deflate":
                raise BadInput(f"body is not valid {coding} data") from exc
            try:  # some clients send a raw deflate stream for "deflate"
                body = _inflate(body, -zlib.MAX_WBITS, max_size)
            except zlib.error:
                raise BadInput("body is not valid deflate data") from exc
    return body


def _inflate(body: bytes, wbits: int, max_size: int) -> bytes:
    inflater = zlib.decompressobj(wbits)
    parts: list[bytes] = []
    size = 0
    data = body
    while True:
        room = max_size - size
        chunk = inflater.decompress(data, min(_CHUNK, room + 1))
        size += len(chunk)
        if size > max_size:
            raise PredictionException(f"the decompressed body is larger than {max_size} bytes", 413)
        parts.append(chunk)
        data = inflater.unconsumed_tail
        if inflater.eof:
            break
        if not data and not chunk:
            raise zlib.error("truncated stream")
    if inflater.unused_data:
        raise zlib.error("data after the end of the compressed stream")
    return b"".join(parts)


def pick_encoding(accept: str | None) -> str | None:
    """``gzip`` or ``deflate`` when ``Accept-Encoding`` accepts one (gzip preferred), else None."""
    quality: dict[str, float] = {}
    for part in (accept or "").split(","):
        coding, _, params = part.strip().partition(";")
        q = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        quality[coding.strip().lower()] = q
    for coding in ("gzip", "deflate"):
        if quality.get(coding, quality.get("*", 0.0)) > 0:
            return coding
    return None


def encode_content(body: bytes, coding: str) -> bytes:
    """``body`` compressed with ``coding`` (``gzip`` or ``deflate``, the zlib format)."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, _WBITS[coding])
    return compressor.compress(body) + compressor.flush()
