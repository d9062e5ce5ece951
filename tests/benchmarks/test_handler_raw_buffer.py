"""handler_raw's reused batch buffer: one copy per body, the same values as stacking, no growth
past the largest batch, and a bad body still rejected."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torchbay.benchmarks import handler_raw

SHAPE = (3, 4, 4)


def _rows(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(SHAPE).astype("<f4") for _ in range(n)]
    kinds = (bytes, bytearray, lambda b: memoryview(bytes(b)))
    return [{"body": kinds[i % 3](a.tobytes())} for i, a in enumerate(arrays)]


def _stacked(rows: list[dict]) -> torch.Tensor:
    return torch.stack(
        [
            torch.from_numpy(np.frombuffer(bytes(r["body"]), "<f4").copy()).reshape(SHAPE)
            for r in rows
        ]
    )


def _handler() -> handler_raw.RawTensorHandler:
    handler = handler_raw.RawTensorHandler.__new__(handler_raw.RawTensorHandler)
    handler.sample_shape = SHAPE
    handler.batch_buffer = None
    return handler


def test_decode_into_buffer_equals_stack() -> None:
    rows = _rows(5, 0)
    buf = torch.full((8, *SHAPE), float("nan"))
    batch = handler_raw.decode_batch(rows, SHAPE, buf)
    assert batch.shape == (5, *SHAPE)
    assert batch.data_ptr() == buf.data_ptr()  # written in place, no new batch tensor
    assert torch.equal(batch, _stacked(rows))
    assert torch.isnan(buf[5:]).all()  # rows past the batch untouched


def test_buffer_is_reused_and_grows_to_the_largest_batch() -> None:
    handler = _handler()
    first = handler.preprocess(_rows(4, 1))
    ptr = handler.batch_buffer.data_ptr()
    rows = _rows(2, 2)
    second = handler.preprocess(rows)
    assert handler.batch_buffer.data_ptr() == ptr  # smaller batch: same storage
    assert second.data_ptr() == ptr and torch.equal(second, _stacked(rows))
    assert first.shape[0] == 4 and handler.batch_buffer.shape[0] == 4
    rows = _rows(7, 3)
    third = handler.preprocess(rows)  # larger batch: the buffer grows once
    assert handler.batch_buffer.shape[0] == 7
    assert torch.equal(third, _stacked(rows))
    again = handler.preprocess(_rows(6, 4))
    assert again.data_ptr() == handler.batch_buffer.data_ptr() == third.data_ptr()


def test_a_bad_body_in_a_batch_is_rejected() -> None:
    rows = _rows(3, 5)
    rows[1] = {"body": b"\0" * 12}
    with pytest.raises(ValueError, match=f"{4 * 48} bytes"):
        _handler().preprocess(rows)
