"""The worker protocol: round trips, malformed frames, and a real worker fed garbage."""

from __future__ import annotations

import asyncio
import socket
import struct
import subprocess
import sys

import pytest

from torchbay.server.serving import protocol as p
from torchbay.server.serving import transport

from .protocol_frames import frame, roundtrip


@pytest.mark.parametrize(
    "message",
    [
        p.Load("/m", "name", "1.0", 8, gpu_id=1, handler="h.py", num_threads=2),
        p.Ready(pid=1, device="cpu", load_time_ms=3.5, num_threads=1, torch_version="x"),
        p.LoadFailed("HandlerLoadError", "no such handler"),
        p.Infer(
            7,
            [
                p.WireRequest("a", b"\x00\xff" * 10, "application/octet-stream", {"x": "y"}),
                p.WireRequest("b", b"", "", {}, "k=v", "v2"),
            ],
        ),
        p.Result(
            7,
            [p.WireResponse(200, b"{}"), p.WireResponse(400, b"e", "text/plain", {"h": "1"})],
            {"inference": 1.0},
            [{"name": "m", "value": 1}],
        ),
        p.Shutdown(),
        p.Tune(num_threads=3),
        p.Cancel("a"),
        p.Regions({"gpu": ["aGFuZGxl", 0, 64, 0]}),
        p.Regions({}),
    ],
)
def test_every_message_round_trips(message):
    assert roundtrip(message) == message


@pytest.mark.parametrize(
    "payload",
    [
        frame(99, {}),  # unknown kind
        frame(p.Kind.LOAD, {}, raw_header=b"{not json"),
        frame(p.Kind.LOAD, [1, 2]),  # header not an object
        frame(p.Kind.LOAD, {"model_dir": "/m"}),  # missing fields
        frame(
            p.Kind.LOAD,
            {
                "surprise": 1,
                "model_dir": "/m",
                "model_name": "m",
                "model_version": "1",
                "batch_size": 1,
            },
        ),
        frame(
            p.Kind.INFER,
            {"batch_id": 1, "requests": [["a", "", {}, "", "predict"]], "_blobs": [5]},
            b"abc",
        ),  # blob sizes lie
        frame(p.Kind.INFER, {"batch_id": 1, "requests": [], "_blobs": [3]}, b"abc"),
        frame(p.Kind.SHUTDOWN, {"_blobs": [1]}, b"x"),
        frame(p.Kind.REGIONS, {"cuda": {"gpu": "not a list"}}),
        frame(p.Kind.REGIONS, {}),
        b"\x01\x00",  # shorter than a header length
    ],
)
def test_malformed_frames_raise_protocol_error(payload):
    with pytest.raises(p.ProtocolError):
        p.decode(payload[0], payload[1:])


@pytest.mark.parametrize(
    "prefix",
    [
        b"\xff" * 5,  # no kind, and 4 GiB
        struct.pack("!IB", 1 << 10, 99),  # an unknown kind
        struct.pack("!IB", 1 << 31, p.Kind.RESULT),  # past MAX_FRAME
    ],
)
def test_bytes_that_are_no_frame_fail_before_their_payload_is_waited_for(prefix):
    """A reader given only the 5 bytes of a prefix (nothing more will come) fails at once."""

    async def read() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(prefix)
        await asyncio.wait_for(transport.read_message(reader), 30)

    with pytest.raises(p.ProtocolError):
        asyncio.run(read())
    parent, child = socket.socketpair()
    with parent, child:
        parent.sendall(prefix)
        with pytest.raises(p.ProtocolError):
            transport.recv_message(child)


def test_a_real_worker_exits_on_a_malformed_first_frame():
    parent, child = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchbay.server.worker", "--fd", str(child.fileno())],
        pass_fds=(child.fileno(),),
        stderr=subprocess.PIPE,
    )
    child.close()
    try:
        garbage = frame(p.Kind.LOAD, {}, raw_header=b"\xff\xfe")
        parent.sendall(struct.pack("!I", len(garbage)) + garbage)
        _, err_bytes = proc.communicate(timeout=30)
        code, err = proc.returncode, err_bytes.decode()
    finally:
        parent.close()
        if proc.poll() is None:
            proc.kill()
    assert code == 3
    assert "protocol error" in err


def test_a_real_worker_reports_load_failure_as_a_message(tmp_path):
    parent, child = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchbay.server.worker", "--fd", str(child.fileno())],
        pass_fds=(child.fileno(),),
        stderr=subprocess.DEVNULL,
    )
    child.close()
    try:
        transport.send_message(parent, p.Load(str(tmp_path), "ghost", "1.0", 1))
        reply = transport.recv_message(parent)
        code = proc.wait(timeout=30)
    finally:
        parent.close()
        if proc.poll() is None:
            proc.kill()
    assert isinstance(reply, p.LoadFailed)
    assert reply.error_type == "HandlerLoadError"
    assert code == 1
