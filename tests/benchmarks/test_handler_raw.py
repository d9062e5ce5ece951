"""handler_raw through torchbay's own archiver and Service, as a worker runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from torchbay.archiver.package import ArchiveOptions, package
from torchbay.benchmarks import handler_raw, models, runner
from torchbay.handlers.runtime.service import Request, load_service


def _model_dir(tmp_path: Path, assets: runner.Assets, name: str) -> Path:
    out = package(
        ArchiveOptions(
            model_name=name,
            version="1.0",
            handler=str(runner.HANDLER_FILE),
            serialized_file=assets.pt[name],
            export_path=tmp_path,
            archive_format="no-archive",
        )
    )
    return Path(out)


@pytest.mark.parametrize("name", ["tiny", "cnn"])
def test_one_class_and_score_per_request(tmp_path: Path, assets: runner.Assets, name: str) -> None:
    threads = torch.get_num_threads()
    try:
        service = load_service(_model_dir(tmp_path, assets, name), batch_size=8)
        assert torch.get_num_threads() == 1  # the baseline's one thread per worker
    finally:
        torch.set_num_threads(threads)
    body = assets.body[name].read_bytes()
    requests = [
        Request(f"r{i}", body=body, content_type="application/octet-stream") for i in range(3)
    ]
    outcome = service.predict(requests)
    assert [r.status for r in outcome.responses] == [200, 200, 200]
    answers = [json.loads(r.body) for r in outcome.responses]
    model = torch.jit.load(str(assets.pt[name]))
    with torch.inference_mode():
        probs = torch.softmax(model(models.sample_tensor(name)[None]), dim=1)[0]
    for answer in answers:
        assert set(answer) == {"class", "score"}
        assert answer["class"] == int(probs.argmax())
        assert answer["score"] == pytest.approx(float(probs.max()), rel=1e-5)


def test_wrong_body_size_is_rejected() -> None:
    with pytest.raises(ValueError, match="256 bytes"):
        handler_raw.decode_batch([{"body": b"\0" * 12}], (64,))


def test_shape_file_wins_over_model_name(tmp_path: Path) -> None:
    (tmp_path / handler_raw.SHAPE_FILE).write_text(json.dumps({"shape": [2, 4]}))
    assert handler_raw.resolve_shape("tiny", str(tmp_path)) == (2, 4)
    assert handler_raw.resolve_shape("cnn", None) == (3, 64, 64)
    with pytest.raises(ValueError, match="no sample shape"):
        handler_raw.resolve_shape("other", None)


def test_decode_and_top1() -> None:
    rows = [{"data": bytearray(torch.arange(4, dtype=torch.float32).numpy().tobytes())}]
    batch = handler_raw.decode_batch(rows * 2, (2, 2))
    assert batch.shape == (2, 2, 2)
    out = handler_raw.top1(torch.tensor([[0.0, 5.0, 0.0], [9.0, 0.0, 0.0]]))
    assert [o["class"] for o in out] == [1, 0]
    assert all(0.9 < o["score"] <= 1.0 for o in out)


def _bodies(n: int, count: int) -> list[bytes]:
    gen = torch.Generator().manual_seed(n)
    return [torch.randn(count, generator=gen).numpy().tobytes() for _ in range(n)]


def test_buffer_decode_equals_the_stack_path() -> None:
    bodies = _bodies(5, 12)
    rows = [{"body": memoryview(bodies[0])}, {"data": bytearray(bodies[1])}] + [
        {"body": b} for b in bodies[2:]
    ]
    stacked = torch.stack(
        [torch.frombuffer(bytearray(b), dtype=torch.float32).reshape(3, 4) for b in bodies]
    )
    assert torch.equal(handler_raw.decode_batch(rows, (3, 4)), stacked)


def test_batch_buffer_is_reused_and_grows() -> None:
    buffer = handler_raw.grow_buffer(None, 4, 6)
    assert handler_raw.grow_buffer(buffer, 3, 6) is buffer  # smaller batch: reused
    assert handler_raw.grow_buffer(buffer, 4, 6) is buffer
    bigger = handler_raw.grow_buffer(buffer, 8, 6)
    assert bigger is not buffer and bigger.shape == (8, 6)
    assert handler_raw.grow_buffer(bigger, 2, 5).shape == (2, 5)  # another sample size
    small = [{"body": b} for b in _bodies(2, 6)]
    batch = handler_raw.decode_batch(small, (6,), bigger)
    assert batch.data_ptr() == bigger.ctypes.data  # written in place: no new batch tensor
    assert torch.equal(batch[1], torch.frombuffer(bytearray(small[1]["body"]), dtype=torch.float32))


def test_a_wrong_size_body_in_a_batch_is_rejected_with_a_buffer() -> None:
    buffer = handler_raw.grow_buffer(None, 3, 4)
    rows = [{"body": b} for b in _bodies(2, 4)] + [{"body": b"\0" * 8}]
    with pytest.raises(ValueError, match="16 bytes"):
        handler_raw.decode_batch(rows, (4,), buffer)


def test_varying_batches_through_one_worker_service(tmp_path: Path, assets: runner.Assets) -> None:
    """Batches of 5, then 2, then 8 through one Service (its buffer reused and grown) answer
    each request as the model does alone."""
    threads = torch.get_num_threads()
    try:
        service = load_service(_model_dir(tmp_path, assets, "tiny"), batch_size=8)
        model = torch.jit.load(str(assets.pt["tiny"]))
        for n in (5, 2, 8):
            bodies = _bodies(n, 64)
            outcome = service.predict(
                [
                    Request(f"r{i}", body=b, content_type="application/octet-stream")
                    for i, b in enumerate(bodies)
                ]
            )
            got = [json.loads(r.body)["class"] for r in outcome.responses]
            with torch.inference_mode():
                x = torch.stack(
                    [torch.frombuffer(bytearray(b), dtype=torch.float32) for b in bodies]
                )
                want = model(x).argmax(dim=1).tolist()
            assert got == want
    finally:
        torch.set_num_threads(threads)
