"""The tensor handler's raw-body path: one copy per body, whatever buffer type the frame gives."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from torchbay.handlers.runtime.service import load_service

from .conftest import body_json, req

X = [1.0, 2.0, 3.0, 4.0]


def _npy(values: list[float]) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.array(values, dtype=np.float32))
    return buf.getvalue()


def test_raw_and_npy_bodies_as_bytes_bytearray_or_memoryview_agree(
    torchscript_dir, tiny_model
) -> None:
    """A frame's memoryview (or bytearray) body is read as float32, never as uint8 elements."""
    raw = np.array(X, dtype="<f4").tobytes()
    bodies = [raw, bytearray(raw), memoryview(raw), memoryview(_npy(X)), bytearray(_npy(X))]
    service = load_service(torchscript_dir(torchbay={"input_shape": [4]}), batch_size=8)
    outcome = service.predict(
        [req(b, "application/octet-stream", f"r{i}") for i, b in enumerate(bodies)]
    )
    assert [r.status for r in outcome.responses] == [200] * len(bodies)
    with torch.no_grad():
        want = tiny_model(torch.tensor([X])).tolist()[0]
    for response in outcome.responses:
        assert body_json(response)["output"] == pytest.approx(want, rel=1e-5)


def test_a_bad_memoryview_body_fails_alone(torchscript_dir) -> None:
    raw = np.array(X, dtype="<f4").tobytes()
    service = load_service(torchscript_dir(torchbay={"input_shape": [4]}), batch_size=8)
    outcome = service.predict(
        [
            req(memoryview(raw), "application/octet-stream", "a"),
            req(memoryview(b"\x00\x01\x02"), "application/octet-stream", "b"),
            req(memoryview(raw), "application/octet-stream", "c"),
        ]
    )
    assert [r.status for r in outcome.responses] == [200, 400, 200]
    assert "4 bytes" in body_json(outcome.responses[1])["message"]
