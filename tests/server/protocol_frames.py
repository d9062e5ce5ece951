"""Shared by tests/server/test_protocol.py and test_streaming_protocol.py: worker-protocol frames
encoded and decoded as the two ends of the pipe do, and frames built by hand."""

from __future__ import annotations

import json
import struct

from torchbay.server.serving import protocol as p


def roundtrip(message: p.Message) -> p.Message:
    """``message`` encoded, its length prefix checked, and decoded again."""
    frame = p.encode(message)
    (length,) = struct.unpack("!I", frame[:4])
    assert length == len(frame) - 4
    return p.decode(frame[4], frame[5:])


def frame(kind: int, header: object, blobs: bytes = b"", raw_header: bytes | None = None) -> bytes:
    """A frame without its length prefix: the kind byte, the header (``header`` as JSON, or
    ``raw_header`` as it is), then ``blobs``."""
    head = raw_header if raw_header is not None else json.dumps(header).encode()
    return struct.pack("!BI", kind, len(head)) + head + blobs
