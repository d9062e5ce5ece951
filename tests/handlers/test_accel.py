"""handlers/runtime/accel.py on CPU: the CUDA path's logic with an injected backend that records
calls.

``RecordingBackend`` has CudaBackend's methods; its "device" is the CPU, its streams, events and
graphs are stand-ins that log what DevicePath asks of them, and its transfers copy (as real ones
do). The tests check what the GPU path promises: one pinned buffer reused and grown, one transfer
each way per batch on the worker's stream, the only synchronisation at the end, CUDA graphs per
padded batch size with eager fallback, autocast/dtype choice, channels_last only for conv models,
and outputs identical to the plain model call.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from torchbay.handlers.base_handler import BaseHandler
from torchbay.handlers.errors import HandlerLoadError
from torchbay.handlers.runtime import accel
from torchbay.handlers.testing import run_handler

from .conftest import write_manifest


class Stream:
    def __init__(self, log: list, name: str) -> None:
        self.log, self.name = log, name

    def wait_stream(self, other: Stream) -> None:
        self.log.append(("wait_stream", self.name, other.name))


class Event:
    def __init__(self, log: list, name: str) -> None:
        self.log, self.name = log, name

    def record(self, stream: Stream) -> None:
        self.log.append(("record", self.name, stream.name))

    def synchronize(self) -> None:
        self.log.append(("synchronize", self.name))


class Graph:
    """Replay re-runs the captured function and writes into the captured (static) outputs."""

    def __init__(self, fn: Any, out: Any, log: list) -> None:
        self.fn, self.out, self.log = fn, out, log

    def replay(self) -> None:
        self.log.append(("replay",))
        fresh = torch.utils._pytree.tree_leaves(self.fn())
        for static, new in zip(torch.utils._pytree.tree_leaves(self.out), fresh, strict=True):
            static.copy_(new)


class RecordingBackend:
    device = torch.device("cpu")

    def __init__(self, fail_capture: bool = False) -> None:
        self.log: list[tuple] = []
        self.default = Stream(self.log, "default")
        self.active = self.default
        self.device_tensors: list[torch.Tensor] = []  # what lives "on the device" (kept alive)
        self.streams = 0
        self.events = 0
        self.fail_capture = fail_capture

    def new_stream(self) -> Stream:
        self.streams += 1
        return Stream(self.log, f"worker{self.streams}")

    def current_stream(self) -> Stream:
        return self.active

    @contextlib.contextmanager
    def stream_scope(self, stream: Stream) -> Any:
        before, self.active = self.active, stream
        try:
            yield
        finally:
            self.active = before

    def new_event(self) -> Event:
        self.events += 1
        return Event(self.log, "staged" if self.events == 1 else "done")

    def is_host(self, tensor: torch.Tensor) -> bool:
        ptr = tensor.untyped_storage().data_ptr()
        return all(t.untyped_storage().data_ptr() != ptr for t in self.device_tensors)

    def record_stream(self, tensor: torch.Tensor, stream: Stream) -> None:
        self.log.append(("record_stream", stream.name))

    def pin(self, nbytes: int) -> torch.Tensor:
        self.log.append(("pin", nbytes))
        return torch.empty(nbytes, dtype=torch.uint8)

    def h2d(self, host: torch.Tensor) -> torch.Tensor:
        self.log.append(("h2d", host.numel(), self.active.name))
        out = host.clone()
        self.device_tensors.append(out)
        return out

    def d2h(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        self.log.append(("d2h", src.numel(), self.active.name))
        dst.copy_(src)

    def set_cudnn_benchmark(self, on: bool) -> None:
        self.log.append(("cudnn_benchmark", on))

    def capture(self, fn: Any, stream: Stream) -> tuple[Graph, Any]:
        if self.fail_capture:
            raise RuntimeError("operation not permitted when stream is capturing")
        fn()  # warm-up
        out = fn()
        self.log.append(("capture", stream.name))
        return Graph(fn, out, self.log), out

    def calls(self, name: str) -> list[tuple]:
        return [c for c in self.log if c[0] == name]


class ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.head = torch.nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x).mean(dim=(2, 3)))


class Conv(ConvNet):
    """ConvNet that keeps the inputs it was called with."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x)
        return super().forward(x)


class Mixed(torch.nn.Module):
    """Two inputs, three outputs of three dtypes (one without float)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.fc = torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.fc(x) + ids[:, :1]
        return y, y.argmax(dim=1), y > 0


def linear() -> torch.nn.Module:
    torch.manual_seed(2)
    return torch.nn.Linear(6, 3).eval()


def device_path(model: Any, backend: RecordingBackend, **options: Any) -> accel.DevicePath:
    batch_size = options.pop("bs", 8)
    opts = accel.AccelOptions(**options)
    path = accel.build(model, "cuda", opts, backend=backend, batch_size=batch_size)
    assert isinstance(path, accel.DevicePath)
    return path


def test_pinned_staging_buffer_is_reused_and_grown() -> None:
    backend = RecordingBackend()
    path = device_path(linear(), backend)
    for n in (2, 2, 1, 3):
        path.run(torch.randn(n, 6))
    assert len(backend.calls("pin")) == 2  # one staging, one landing buffer, both reused
    first = path.staging.data
    path.run(torch.randn(1000, 6))  # 24,000 bytes: more than the 4 KiB first allocation
    assert path.staging.data is not first and path.staging.data.numel() >= 24_000
    assert path.staging.allocations == 2
    path.run(torch.randn(10, 6))
    assert path.staging.allocations == 2
    # Before each write into the staging buffer, the event behind the last copy was waited on.
    log = [c for c in backend.log if c[:2] == ("synchronize", "staged") or c[0] == "h2d"]
    assert [c[0] for c in log] == ["synchronize", "h2d"] * 6


def test_one_transfer_each_way_per_batch_on_the_worker_stream() -> None:
    backend = RecordingBackend()
    model = Mixed().eval()
    path = device_path(model, backend)
    x, ids = torch.randn(4, 6), torch.arange(8, dtype=torch.int64).reshape(4, 2)
    backend.log.clear()
    out = path.run(x, ids)
    assert [c[0] for c in backend.log if c[0] in ("h2d", "d2h")] == ["h2d", "d2h"]
    assert {c[2] for c in backend.calls("h2d") + backend.calls("d2h")} == {"worker1"}
    assert backend.calls("synchronize") == [("synchronize", "staged"), ("synchronize", "done")]
    assert backend.log[0] == ("wait_stream", "worker1", "default")
    with torch.inference_mode():
        want = model(x, ids)
    assert len(out) == 3
    for got, expect in zip(out, want, strict=True):
        assert got.dtype == expect.dtype and torch.equal(got, expect)


def test_device_resident_inputs_skip_staging_and_are_recorded_on_the_stream() -> None:
    backend = RecordingBackend()
    path = device_path(linear(), backend)
    x = torch.randn(3, 6)
    backend.device_tensors.append(x)
    backend.log.clear()
    path.run(x)
    assert backend.calls("h2d") == [] and backend.calls("record_stream") == [
        ("record_stream", "worker1")
    ]
    assert len(backend.calls("d2h")) == 1


def test_outputs_identical_to_the_plain_call() -> None:
    model = Conv().eval()
    x = torch.randn(5, 3, 8, 8)
    with torch.inference_mode():
        want = model(x)
    got = device_path(model, RecordingBackend(), channels_last=False).run(x)
    plain = accel.build(model, "cpu").run(x)
    assert torch.equal(got, want) and torch.equal(plain, want)
    assert not got.is_inference()  # a normal tensor the handler's postprocess may use freely


def test_cuda_graph_pads_a_partial_batch_and_slices_back() -> None:
    backend = RecordingBackend()
    model = linear()
    path = device_path(model, backend, cuda_graphs=True)
    assert path.graphs is not None and path.graphs.sizes == (1, 2, 4, 8)
    x = torch.randn(3, 6)
    out = path.run(x)
    with torch.inference_mode():
        want = model(x)
    assert out.shape == (3, 3) and torch.allclose(out, want)
    assert len(backend.calls("capture")) == 1 and next(iter(path.graphs.graphs))[0] == 4
    static_in = next(iter(path.graphs.graphs.values()))[0][0]
    assert torch.equal(static_in[3:], torch.zeros(1, 6))  # the padding row
    out = path.run(torch.randn(4, 6))  # same padded size: replay, no new capture
    assert len(backend.calls("capture")) == 1 and len(backend.calls("replay")) == 2
    assert out.shape == (4, 3)


def test_cuda_graph_falls_back_to_eager_for_uncaptured_shapes() -> None:
    backend = RecordingBackend()
    model = linear()
    path = device_path(model, backend, cuda_graphs=True, graph_batch_sizes=(2, 4))
    big = torch.randn(9, 6)  # larger than any captured size
    out = path.run(big)
    with torch.inference_mode():
        assert torch.allclose(out, model(big))
    assert backend.calls("capture") == [] and backend.calls("replay") == []
    # A model whose capture fails runs eagerly, and is not tried again for that shape.
    failing = RecordingBackend(fail_capture=True)
    path = device_path(model, failing, cuda_graphs=True)
    for _ in range(2):
        assert path.run(torch.randn(2, 6)).shape == (2, 3)
    assert len(path.graphs.uncapturable) == 1 and failing.calls("replay") == []


def test_a_graph_whose_buffers_cannot_be_made_runs_eagerly() -> None:
    # graph_batch_sizes past what the device can hold (here past what any tensor can): the
    # static input buffers fail to allocate. The batch runs eagerly and that shape is not tried
    # again, as for a capture that fails; it was the batch's error, every time.
    backend = RecordingBackend()
    model = linear()
    path = device_path(model, backend, cuda_graphs=True, graph_batch_sizes=(2**62,))
    x = torch.randn(3, 6)
    for _ in range(2):
        out = path.run(x)
        with torch.inference_mode():
            assert torch.allclose(out, model(x))
    assert len(path.graphs.uncapturable) == 1 and backend.calls("capture") == []


def test_cuda_graph_off_for_outputs_without_batch_dimension() -> None:
    class Total(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.sum()

    backend = RecordingBackend()
    path = device_path(Total(), backend, cuda_graphs=True)
    x = torch.ones(3, 6)
    assert path.run(x).item() == 18.0  # eager: the padded graph would not be sliceable
    assert len(path.graphs.uncapturable) == 1 and backend.calls("replay") == []


def test_autocast_dtype_selection() -> None:
    assert accel.autocast_dtype("fp16", torch.float32) is torch.float16
    assert accel.autocast_dtype("bf16", torch.float32) is torch.bfloat16
    assert accel.autocast_dtype(None, torch.float32) is None
    # A model converted at packing already runs in its dtype.
    assert accel.autocast_dtype("fp16", torch.bfloat16) is None
    backend = RecordingBackend()
    out = device_path(linear(), backend, autocast="bf16").run(torch.randn(2, 6))
    assert out.dtype is torch.bfloat16


def test_inputs_cast_to_a_half_model_dtype() -> None:
    model = linear().to(torch.bfloat16)
    path = accel.build(model, "cuda", backend=RecordingBackend(), model_dtype=torch.bfloat16)
    x = torch.randn(2, 6)
    out = path.run(x)
    with torch.inference_mode():
        assert out.dtype is torch.bfloat16 and torch.equal(out, model(x.to(torch.bfloat16)))
    ids = torch.arange(4).reshape(2, 2)  # integer inputs keep their dtype
    assert accel._prepare(ids, torch.bfloat16, False).dtype is torch.int64


def test_channels_last_only_for_conv_models() -> None:
    backend = RecordingBackend()
    conv = Conv().eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.inference_mode():
        want = conv(x)
    got = device_path(conv, backend).run(x)
    assert conv.conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert conv.seen[-1].is_contiguous(memory_format=torch.channels_last)
    assert not conv.seen[-1].is_contiguous()
    assert torch.allclose(got, want, atol=1e-5)
    assert ("cudnn_benchmark", True) in backend.log
    # Not for a model without Conv2d, even with a 4-D input; not by default on CPU.
    assert not accel.use_channels_last(None, torch.nn.Flatten(), True)
    assert not accel.use_channels_last(True, torch.nn.Flatten(), True)
    assert not accel.build(Conv().eval(), "cpu").channels_last
    assert accel.use_channels_last(True, torch.jit.script(ConvNet().eval()), False)
    seen: list[torch.Tensor] = []
    flat = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 2)).eval()
    flat.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    device_path(flat, RecordingBackend()).run(x)  # a 4-D input of a model without Conv2d
    assert seen[-1].is_contiguous()
    off = RecordingBackend()
    device_path(Conv().eval(), off, channels_last=False, cudnn_benchmark=False)
    assert off.calls("cudnn_benchmark") == []


def test_cpu_path_costs_nothing() -> None:
    path = accel.build(linear(), "cpu")
    assert isinstance(path, accel.PlainPath) and not hasattr(path, "stream")
    assert path.autocast is None and path.channels_last is False


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"autocast": "fp8"}, "autocast"),
        ({"cuda_graph": True}, "unknown"),
        ({"channels_last": "yes"}, "channels_last"),
        ({"graph_batch_sizes": [0]}, "graph_batch_sizes"),
        ([1], "mapping"),
    ],
)
def test_bad_options_are_a_load_error(raw: Any, message: str) -> None:
    with pytest.raises(HandlerLoadError, match=message):
        accel.options_from({"handler": {"torchbay": raw}})


def test_options_from_model_config() -> None:
    assert accel.options_from({}) == accel.AccelOptions()
    raw = {"autocast": "FP16", "cuda_graphs": True, "graph_batch_sizes": [8, 2, 2]}
    opts = accel.options_from({"handler": {"torchbay": raw}})
    assert opts == accel.AccelOptions(autocast="fp16", cuda_graphs=True, graph_batch_sizes=(2, 8))


class JsonRows(BaseHandler):
    """BaseHandler with JSON-list bodies; the model call is BaseHandler's."""

    def preprocess(self, data: list[Any]) -> torch.Tensor:
        return torch.tensor([json.loads(row["body"]) for row in data], dtype=torch.float32)


class JsonRowsOnDevicePath(JsonRows):
    accel_backend = RecordingBackend()


def test_real_model_through_the_handler_same_outputs(tmp_path: Path) -> None:
    """A TorchScript conv archive served by a BaseHandler subclass: the device path (injected
    backend, graphs and channels_last on) answers exactly what the plain path does."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    torch.jit.script(ConvNet().eval()).save(str(model_dir / "model.pt"))
    write_manifest(model_dir, serialized="model.pt", handler="base")
    torch.manual_seed(3)
    bodies = [json.dumps(torch.randn(3, 8, 8).tolist()).encode() for _ in range(3)]
    config = {"handler": {"torchbay": {"cuda_graphs": True, "channels_last": False}}}
    plain = run_handler(JsonRows(), bodies, model_dir=model_dir, batch_size=4)
    backend = JsonRowsOnDevicePath.accel_backend
    fast = run_handler(
        JsonRowsOnDevicePath(), bodies, model_dir=model_dir, batch_size=4,
        model_yaml_config=config,
    )  # fmt: skip
    assert [r.status for r in fast] == [200] * 3
    assert [r.json() for r in fast] == [r.json() for r in plain]
    assert len(backend.calls("h2d")) == 1 and len(backend.calls("d2h")) == 1
    assert len(backend.calls("capture")) == 1  # batch of 3 padded to the captured 4


def test_enabled_false_keeps_a_cuda_model_on_the_plain_path() -> None:
    opts = accel.options_from({"handler": {"torchbay": {"enabled": False}}})
    assert opts.enabled is False
    path = accel.build(linear(), "cuda", opts)  # builds without touching CUDA
    assert isinstance(path, accel.PlainPath)
    assert isinstance(accel.build(linear(), "cuda", opts, backend=RecordingBackend()),
                      accel.PlainPath)  # fmt: skip


def test_tensor_handler_batch_takes_one_transfer_each_way(torchscript_dir: Any) -> None:
    """The built-in tensor handler leaves its inputs on the host and calls run_model: a batch of
    three requests is one staged copy in and one copy out, with the plain path's answers."""
    from torchbay.handlers.tensor import TensorHandler

    class OnDevicePath(TensorHandler):
        accel_backend = RecordingBackend()

    model_dir = torchscript_dir(torchbay={"input_shape": [4]})
    bodies = [[float(i), 1.0, 2.0, 3.0] for i in range(3)]  # JSON bodies
    plain = run_handler(TensorHandler(), bodies, model_dir=model_dir)
    fast = run_handler(OnDevicePath(), bodies, model_dir=model_dir)
    assert [r.status for r in fast] == [200] * 3
    assert [r.json() for r in fast] == [r.json() for r in plain]
    backend = OnDevicePath.accel_backend
    assert len(backend.calls("h2d")) == 1 and len(backend.calls("d2h")) == 1


def test_handler_that_sets_its_own_model_without_base_init() -> None:
    """A TorchServe-style handler that skips BaseHandler.__init__/initialize and sets
    ``self.model`` itself still gets run_model (the plain path on CPU)."""

    class Own(BaseHandler):
        def __init__(self) -> None:  # no super().__init__()
            self.model = linear()

    handler = Own()
    x = torch.randn(2, 6)
    with torch.inference_mode():
        assert torch.equal(handler.inference(x), handler.model(x))
    handler.model = linear().double()  # replaced: the path is rebuilt for the new model
    assert handler.inference(x.double()).dtype is torch.float64


def test_bad_option_in_the_archive_model_config_fails_the_load(tmp_path: Path) -> None:
    from torchbay.handlers.testing import load_handler

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    torch.jit.script(linear()).save(str(model_dir / "model.pt"))
    (model_dir / "model-config.yaml").write_text("handler:\n  torchbay:\n    autocast: fp8\n")
    write_manifest(model_dir, serialized="model.pt", handler="tensor",
                   config_file="model-config.yaml")  # fmt: skip
    with (
        pytest.raises(HandlerLoadError, match="autocast 'fp8'"),
        load_handler("tensor", model_dir=model_dir),
    ):
        pass
