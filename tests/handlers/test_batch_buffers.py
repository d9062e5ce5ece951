"""The tensor handler's reused batch buffers (handlers/batching.py) and its batch path."""

from __future__ import annotations

import json

import pytest
import torch

from torchbay.handlers.batching import BatchBuffers
from torchbay.handlers.runtime.service import load_service

from .conftest import body_json, req


def _parts(sizes: list[int], dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn((n, 2, 3), generator=gen) * 100).to(dtype) for n in sizes]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64])
def test_assemble_equals_cat_for_mixed_sizes(dtype: torch.dtype) -> None:
    buffers = BatchBuffers()
    for seed, sizes in enumerate([[1, 3, 2], [2, 1], [4, 4, 1, 1]]):
        parts = _parts(sizes, dtype, seed)
        batch = buffers.assemble(parts)
        assert batch.dtype == dtype and torch.equal(batch, torch.cat(parts))


def test_buffer_is_reused_and_grows() -> None:
    buffers = BatchBuffers()
    first = buffers.assemble(_parts([2, 2], torch.float32, 0))
    smaller = buffers.assemble(_parts([1, 2], torch.float32, 1))
    assert smaller.data_ptr() == first.data_ptr()  # same storage, nothing allocated
    larger = buffers.assemble(_parts([3, 3], torch.float32, 2))
    assert larger.shape[0] == 6
    again = buffers.assemble(_parts([2, 1, 1], torch.float32, 3))
    assert again.data_ptr() == larger.data_ptr()


def test_keys_are_separate_and_bounded() -> None:
    buffers = BatchBuffers(max_keys=2)
    f32 = buffers.assemble(_parts([1, 1], torch.float32, 0))
    i64 = buffers.assemble(_parts([1, 1], torch.int64, 1))
    assert f32.data_ptr() != i64.data_ptr()
    other = [torch.zeros((1, 5)), torch.ones((1, 5))]
    assert torch.equal(buffers.assemble(other), torch.cat(other))
    assert len(buffers._buffers) == 2  # the least recently used (float32 2x3) was dropped


def test_single_part_is_not_copied() -> None:
    part = _parts([3], torch.float32, 0)[0]
    assert BatchBuffers().assemble([part]).data_ptr() == part.data_ptr()


def test_output_aliasing_the_buffer_outlives_the_batch() -> None:
    buffers = BatchBuffers()
    parts = _parts([1, 1], torch.float32, 0)
    batch = buffers.assemble(parts)
    kept = buffers.detach_from(batch, [batch[0:1], batch * 2, "not a tensor"])
    want = kept[0].clone()
    buffers.assemble(_parts([1, 1], torch.float32, 9))  # overwrites the buffer
    assert torch.equal(kept[0], want) and kept[2] == "not a tensor"
    assert kept[1].untyped_storage().data_ptr() != batch.untyped_storage().data_ptr()


def test_batches_through_the_service_match_one_by_one(torchscript_dir, tiny_model) -> None:
    service = load_service(torchscript_dir(torchbay={"input_shape": [4]}), batch_size=4)
    rows = [[float(i + k) for k in range(4)] for i in range(4)]
    with torch.no_grad():
        want = [tiny_model(torch.tensor([r])).tolist()[0] for r in rows]
    for order in ([0, 1, 2, 3], [3, 1], [2, 0, 1, 3]):  # reused buffers across batches
        reqs = [req(json.dumps(rows[i]), "application/json", f"r{i}") for i in order]
        reqs.insert(1, req(b"\x00\x01\x02", "application/octet-stream", "bad"))
        responses = service.predict(reqs).responses
        assert responses[1].status == 400  # a bad item fails alone
        good = [r for k, r in enumerate(responses) if k != 1]
        for i, response in zip(order, good, strict=True):
            assert response.status == 200
            assert body_json(response)["output"] == pytest.approx(want[i], rel=1e-5)
