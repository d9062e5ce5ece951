"""The streaming frames (Part, Cancel) round-trip, and malformed ones are ProtocolErrors."""

from __future__ import annotations

import pytest

from torchbay.server.serving import protocol as p

from .protocol_frames import frame, roundtrip


@pytest.mark.parametrize(
    "message",
    [
        p.Part(3, "r-1", p.WireResponse(200, b"\x00part", "text/plain", {"x": "y"}, True)),
        p.Part(3, "r-2", p.WireResponse(500, b"", "application/json", {}, True)),
        p.Cancel("r-1"),
    ],
)
def test_streaming_messages_round_trip(message: p.Message) -> None:
    assert roundtrip(message) == message


def test_a_part_is_always_partial_and_a_result_never() -> None:
    part = roundtrip(p.Part(1, "r", p.WireResponse(200, b"x")))
    assert isinstance(part, p.Part) and part.response.partial
    result = roundtrip(p.Result(1, [p.WireResponse(200, b"x", partial=True)]))
    assert isinstance(result, p.Result) and not result.responses[0].partial


GOOD_PART = {"batch_id": 1, "request_id": "r", "response": [200, "text/plain", {}]}


@pytest.mark.parametrize(
    "payload",
    [
        frame(p.Kind.PART, {**GOOD_PART, "_blobs": []}),  # no body
        frame(p.Kind.PART, {**GOOD_PART, "_blobs": [1, 1]}, b"ab"),  # two bodies
        frame(p.Kind.PART, {**GOOD_PART, "response": [200, "t"], "_blobs": [1]}, b"a"),
        frame(p.Kind.PART, {**GOOD_PART, "response": [200, "t", []], "_blobs": [1]}, b"a"),
        frame(p.Kind.PART, {**GOOD_PART, "batch_id": "x", "_blobs": [1]}, b"a"),
        frame(p.Kind.PART, {"request_id": "r", "response": [200, "", {}], "_blobs": [1]}, b"a"),
        frame(p.Kind.CANCEL, {}),  # no request id
        frame(p.Kind.CANCEL, {"request_id": "r", "_blobs": [1]}, b"x"),
    ],
)
def test_malformed_streaming_frames_raise_protocol_error(payload: bytes) -> None:
    with pytest.raises(p.ProtocolError):
        p.decode(payload[0], payload[1:])
