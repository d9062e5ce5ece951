"""The device path of a handler's model call: the inference-side advice of PyTorch's tuning guide.

``build(model, device, options, ...)`` returns the object ``BaseHandler.run_model`` calls once per
batch. On a CPU device it is a :class:`PlainPath` (``inference_mode``, the model's input dtype,
optional autocast): no pinned memory, no streams, nothing else. On a CUDA device it is a
:class:`DevicePath`, which per batch

* packs the host input tensors into ONE reused pinned staging buffer (grown when a batch needs
  more) and moves it with ONE ``non_blocking`` copy on the worker's own CUDA stream; the buffer is
  rewritten only after the event recorded behind the previous copy has completed;
* casts floating inputs to the model's dtype on the device (fp16/bf16 archives), makes 4-D inputs
  ``channels_last`` when the model has 2-D convolutions (the model was converted at build), and
  runs the model under ``torch.inference_mode()`` and the optional autocast (fp16/bf16);
* replays a CUDA graph instead when enabled and the batch fits a captured size (a partial batch is
  padded up to the next size and the outputs sliced back; any other shape runs eagerly);
* packs every output tensor into one device buffer and brings it back with ONE device->host copy
  into a reused pinned buffer, followed by the batch's only host-device synchronisation.

The CUDA calls go through a :class:`CudaBackend` (handlers/accel_cuda.py, with the graph cache);
tests give ``build`` a stand-in with the same methods that records the calls and runs on the CPU
(tests/handlers/test_accel.py).

Options come from model-config.yaml, ``handler: {torchbay: {...}}`` (see :func:`options_from` and
docs/gpu.md). None of this has been measured on a GPU yet.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..errors import HandlerLoadError
from .accel_cuda import CudaBackend, GraphCache

logger = logging.getLogger(__name__)

AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
_HALF = (torch.float16, torch.bfloat16)
_ALIGN = 64  # bytes: every packed tensor starts aligned, so byte views re-view as any dtype
_OPTION_KEYS = (
    "enabled",
    "autocast",
    "channels_last",
    "cudnn_benchmark",
    "cuda_graphs",
    "graph_batch_sizes",
)


@dataclass(frozen=True)
class AccelOptions:
    """``enabled``: False keeps even a CUDA model on the plain path (an escape hatch).
    ``autocast``: None | "fp16" | "bf16". ``channels_last``/``cudnn_benchmark``: None = the
    default (on for CUDA; channels_last only for models with Conv2d). ``cuda_graphs``: capture per
    padded batch size (``graph_batch_sizes``; empty = powers of two up to the batch size)."""

    enabled: bool = True
    autocast: str | None = None
    channels_last: bool | None = None
    cudnn_benchmark: bool | None = None
    cuda_graphs: bool = False
    graph_batch_sizes: tuple[int, ...] = ()


def options_from(yaml_config: Any) -> AccelOptions:
    """The options of model-config.yaml's ``handler: {torchbay: {...}}``; a bad one is a
    HandlerLoadError naming it."""
    handler = (yaml_config or {}).get("handler") if isinstance(yaml_config, dict) else None
    raw = handler.get("torchbay") if isinstance(handler, dict) else None
    if raw is None:
        return AccelOptions()
    if not isinstance(raw, dict):
        raise HandlerLoadError("model-config handler.torchbay must be a mapping")
    unknown = sorted(set(raw) - set(_OPTION_KEYS))
    if unknown:
        raise HandlerLoadError(f"unknown handler.torchbay option(s) {unknown}: want {_OPTION_KEYS}")
    autocast = raw.get("autocast")
    autocast = None if autocast in (None, False, "off", "none") else str(autocast).lower()
    if autocast is not None and autocast not in AUTOCAST_DTYPES:
        raise HandlerLoadError(f"handler.torchbay.autocast {autocast!r}: want fp16, bf16 or off")
    flags = {}
    for key in ("enabled", "channels_last", "cudnn_benchmark", "cuda_graphs"):
        value = raw.get(key)
        if value is not None and not isinstance(value, bool):
            raise HandlerLoadError(f"handler.torchbay.{key} must be true or false")
        flags[key] = value
    sizes = raw.get("graph_batch_sizes") or []
    if not isinstance(sizes, list) or not all(
        isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes
    ):
        raise HandlerLoadError("handler.torchbay.graph_batch_sizes must be positive integers")
    return AccelOptions(
        enabled=flags["enabled"] is not False,
        autocast=autocast,
        channels_last=flags["channels_last"],
        cudnn_benchmark=flags["cudnn_benchmark"],
        cuda_graphs=bool(flags["cuda_graphs"]),
        graph_batch_sizes=tuple(sorted(set(sizes))),
    )


def autocast_dtype(option: str | None, model_dtype: torch.dtype) -> torch.dtype | None:
    """The autocast dtype, or None: off, or the model already stored in half precision
    (converted at packing with ``--precision``: it runs in its own dtype)."""
    if option is None or model_dtype in _HALF:
        return None
    return AUTOCAST_DTYPES[option]


def has_conv2d(model: Any) -> bool:
    """True when the model holds a 2-D convolution (eager or TorchScript modules)."""
    modules = getattr(model, "modules", None)
    if modules is None:
        return False
    for module in modules():
        if isinstance(module, torch.nn.Conv2d) or getattr(module, "original_name", "") == "Conv2d":
            return True
    return False


def use_channels_last(option: bool | None, model: Any, default: bool) -> bool:
    """channels_last only for conv models; ``default`` when not set (on for the device path)."""
    if option is False or not has_conv2d(model):
        return False
    return option is True or default


def graph_sizes(options: AccelOptions, batch_size: int) -> tuple[int, ...]:
    if options.graph_batch_sizes:
        return options.graph_batch_sizes
    sizes, size = [], 1
    while size < batch_size:
        sizes.append(size)
        size *= 2
    return (*sizes, max(1, batch_size))


def _prepare(value: Any, dtype: torch.dtype, channels_last: bool) -> Any:
    """A floating tensor cast to a half-precision model's dtype (fp16/bf16 archives; other
    dtypes are left to the handler), 4-D ones channels_last when asked."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.is_floating_point() and dtype in _HALF and value.dtype != dtype:
        value = value.to(dtype)
    if channels_last and value.dim() == 4:
        value = value.contiguous(memory_format=torch.channels_last)
    return value


def _to_channels_last(model: Any) -> None:
    try:
        model.to(memory_format=torch.channels_last)
    except Exception as exc:  # e.g. a frozen TorchScript module: its weights are constants
        logger.warning("cannot convert the model to channels_last (inputs still are): %s", exc)


class PlainPath:
    """The CPU path: the model under ``inference_mode`` (and optional autocast), nothing else."""

    def __init__(
        self, model: Any, device: torch.device, options: AccelOptions, model_dtype: torch.dtype
    ) -> None:
        self.model = model
        self.device = device
        self.dtype = model_dtype
        self.autocast = autocast_dtype(options.autocast, model_dtype)
        self.channels_last = use_channels_last(options.channels_last, model, False)
        if self.channels_last:
            _to_channels_last(model)

    def run(self, *inputs: Any, **kwargs: Any) -> Any:
        with torch.inference_mode(), _autocast(self.device.type, self.autocast, cache=True):
            args = [_prepare(_on(v, self.device), self.dtype, self.channels_last) for v in inputs]
            return self.model(*args, **kwargs)


def _on(value: Any, device: torch.device) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _autocast(device_type: str, dtype: torch.dtype | None, cache: bool) -> Any:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype, cache_enabled=cache)


def _layout(tensors: list[torch.Tensor]) -> tuple[list[int], int]:
    """Byte offsets (each aligned) of ``tensors`` packed one after another, and the total."""
    offsets, total = [], 0
    for t in tensors:
        offsets.append(total)
        total += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
    return offsets, total


def _view(buf: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """``buf``'s bytes at ``offset`` viewed as a tensor of ``like``'s dtype and shape."""
    nbytes = like.numel() * like.element_size()
    return buf[offset : offset + nbytes].view(like.dtype).view(like.shape)


class PinnedBuffer:
    """A reused pinned host buffer of bytes, grown (to a power of two) when too small."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.data: torch.Tensor | None = None
        self.allocations = 0

    def get(self, nbytes: int) -> torch.Tensor:
        if self.data is None or self.data.numel() < nbytes:
            size = 1 << max(12, (nbytes - 1).bit_length())
            self.data = self.backend.pin(size)
            self.allocations += 1
        return self.data


class DevicePath:
    """The CUDA path (see the module docstring); ``backend`` holds every CUDA call."""

    def __init__(
        self,
        model: Any,
        backend: Any,
        options: AccelOptions,
        model_dtype: torch.dtype,
        batch_size: int = 1,
    ) -> None:
        self.model = model
        self.backend = backend
        self.device = backend.device
        self.dtype = model_dtype
        self.autocast = autocast_dtype(options.autocast, model_dtype)
        self.channels_last = use_channels_last(options.channels_last, model, True)
        if self.channels_last:
            _to_channels_last(model)
        if options.cudnn_benchmark is not False:
            backend.set_cudnn_benchmark(True)
        self.stream = backend.new_stream()
        self.staging = PinnedBuffer(backend)
        self.landing = PinnedBuffer(backend)
        self.staged = backend.new_event()  # recorded behind the last host->device copy
        self.graphs = (
            GraphCache(backend, self.stream, self._call, graph_sizes(options, batch_size))
            if options.cuda_graphs
            else None
        )

    def run(self, *inputs: Any, **kwargs: Any) -> Any:
        backend, stream = self.backend, self.stream
        stream.wait_stream(backend.current_stream())  # the handler's earlier work on the device
        cache = self.graphs is None  # autocast's weight cache must be off under graph capture
        with backend.stream_scope(stream):
            args = self._stage(list(inputs))
            with torch.inference_mode(), _autocast(self.device.type, self.autocast, cache):
                args = [_prepare(v, self.dtype, self.channels_last) for v in args]
                out = self.graphs.run(args, kwargs) if self.graphs is not None else None
                if out is None:
                    out = self._call(*args, **kwargs)
            return self._to_host(out)

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    def _stage(self, args: list[Any]) -> list[Any]:
        """Host tensors -> device through the pinned staging buffer, in one copy."""
        be = self.backend
        host = [i for i, v in enumerate(args) if isinstance(v, torch.Tensor) and be.is_host(v)]
        for i, v in enumerate(args):
            if isinstance(v, torch.Tensor) and i not in host:
                self.backend.record_stream(v, self.stream)  # made on another stream, used here
        if not host:
            return args
        tensors = [args[i] for i in host]
        offsets, total = _layout(tensors)
        self.staged.synchronize()  # the previous copy out of the buffer has finished
        buf = self.staging.get(total)
        for t, off in zip(tensors, offsets, strict=True):
            _view(buf, off, t).copy_(t)
        on_device = self.backend.h2d(buf[:total])
        self.staged.record(self.stream)
        for i, t, off in zip(host, tensors, offsets, strict=True):
            args[i] = _view(on_device, off, t)
        return args

    def _to_host(self, out: Any) -> Any:
        """Every device tensor of ``out`` back to the host with one copy and one sync."""
        leaves, spec = pytree.tree_flatten(out)
        idx = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        if not idx:
            return out
        tensors = [leaves[i] for i in idx]
        offsets, total = _layout(tensors)
        if len(tensors) == 1 and tensors[0].is_contiguous():
            packed = tensors[0].reshape(-1).view(torch.uint8)  # no device-side packing needed
        else:
            packed = torch.empty(total, dtype=torch.uint8, device=self.device)
            for t, off in zip(tensors, offsets, strict=True):
                _view(packed, off, t).copy_(t)
        landing = self.landing.get(total)
        self.backend.d2h(landing[: packed.numel()], packed)
        done = self.backend.new_event()
        done.record(self.stream)
        done.synchronize()  # the batch's only host-device synchronisation
        for i, t, off in zip(idx, tensors, offsets, strict=True):
            leaves[i] = _view(landing, off, t).clone()  # the buffer is reused next batch
        return pytree.tree_unflatten(leaves, spec)


def build(
    model: Any,
    device: str | torch.device,
    options: AccelOptions | None = None,
    *,
    model_dtype: torch.dtype = torch.float32,
    batch_size: int = 1,
    backend: Any = None,
) -> PlainPath | DevicePath:
    """The path for ``model`` on ``device``: DevicePath for CUDA (or an injected backend)."""
    options = options or AccelOptions()
    device = torch.device(device)
    if not options.enabled or (backend is None and device.type != "cuda"):
        return PlainPath(model, device, options, model_dtype)
    backend = backend or CudaBackend(device)
    return DevicePath(model, backend, options, model_dtype, batch_size)
