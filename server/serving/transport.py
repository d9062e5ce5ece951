"""Frames on the worker socket: reading one (the frontend's asyncio side, the worker's blocking
side) and writing one. ``protocol.py`` says what a frame holds; this module moves them. A length
or kind that is no frame's fails at the 5-byte prefix, before its payload is waited for.
Torch-free: the frontend imports this."""

from __future__ import annotations

import asyncio
import socket
import struct

from torchbay.server.serving.protocol import MAX_FRAME, Kind, Message, ProtocolError, decode, encode

_KINDS = frozenset(Kind)


def _prefix(prefix: bytes | bytearray) -> tuple[int, int]:
    """A frame's (length, kind), checked before its payload is waited for: bytes that are no
    frame (a handler writing to the wrong descriptor) fail here, not after a wait for gigabytes."""
    length, kind = struct.unpack("!IB", prefix)
    if length < 5:
        raise ProtocolError(f"frame length {length} is too short")
    if length >= MAX_FRAME or kind not in _KINDS:
        raise ProtocolError(f"not a frame: kind {kind}, length {length}")
    return length, kind


async def read_message(reader: asyncio.StreamReader) -> Message:
    """Read one frame; ``asyncio.IncompleteReadError`` means the peer closed the socket."""
    length, kind = _prefix(await reader.readexactly(5))
    payload = await reader.readexactly(length - 1)
    return decode(kind, payload)


def _recv_exactly(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        chunk = sock.recv_into(view[got:], n - got)
        if chunk == 0:
            raise EOFError("peer closed the socket")
        got += chunk
    return buf


def recv_message(sock: socket.socket) -> Message:
    """Blocking read of one frame (the worker side). ``EOFError`` when the frontend is gone."""
    length, kind = _prefix(_recv_exactly(sock, 5))
    return decode(kind, _recv_exactly(sock, length - 1))


def send_message(sock: socket.socket, message: Message) -> None:
    sock.sendall(encode(message))
