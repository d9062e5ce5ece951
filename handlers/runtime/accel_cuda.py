"""The CUDA side of handlers/accel.py: the backend (every CUDA call, one line each) and the
CUDA graph cache (one graph per padded batch size, eager fallback for anything else).

Nothing here runs without CUDA except through an injected backend (tests/handlers/test_accel.py);
it has not been measured on a GPU (docs/gpu.md).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.utils import _pytree as pytree

logger = logging.getLogger(__name__)

MAX_GRAPHS = 16


class GraphCache:
    """CUDA graphs per (padded batch size, sample shapes and dtypes), captured on first use."""

    def __init__(self, backend: Any, stream: Any, fn: Any, sizes: tuple[int, ...]) -> None:
        self.backend = backend
        self.stream = stream
        self.fn = fn
        self.sizes = tuple(sorted(sizes))
        self.graphs: dict[tuple, tuple[list[torch.Tensor], Any, Any]] = {}
        self.uncapturable: set[tuple] = set()

    def padded(self, n: int) -> int | None:
        return next((s for s in self.sizes if s >= n), None)

    def key(self, args: list[Any], kwargs: dict[str, Any]) -> tuple | None:
        """The graph key of a batch, or None when it cannot use a graph."""
        if kwargs or not args or not all(isinstance(a, torch.Tensor) and a.dim() for a in args):
            return None
        n = args[0].shape[0]
        size = self.padded(n)
        if size is None or any(a.shape[0] != n for a in args):
            return None
        return (size, tuple((tuple(a.shape[1:]), a.dtype, _memory_format(a)) for a in args))

    def run(self, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """The outputs of a graph replay, sliced to the batch; None: run it eagerly."""
        key = self.key(args, kwargs)
        if key is None or key in self.uncapturable:
            return None
        entry = self.graphs.get(key)
        if entry is None:
            if len(self.graphs) >= MAX_GRAPHS:
                return None
            entry = self._capture(key, args)
            if entry is None:
                return None
        static_in, graph, static_out = entry
        n, size = args[0].shape[0], key[0]
        for buf, arg in zip(static_in, args, strict=True):
            buf[:n].copy_(arg)
            if n < size:
                buf[n:].zero_()
        graph.replay()
        return pytree.tree_map(lambda t: t[:n] if isinstance(t, torch.Tensor) else t, static_out)

    def _capture(self, key: tuple, args: list[torch.Tensor]) -> Any:
        size = key[0]
        try:  # the static buffers too: a size past the device's memory is eager, not an error
            static_in = [_static_like(a, size) for a in args]
            graph, static_out = self.backend.capture(lambda: self.fn(*static_in), self.stream)
        except Exception as exc:  # an op that cannot be captured: eager for this shape
            logger.warning("CUDA graph capture failed for batch %d; running eagerly: %s", size, exc)
            self.uncapturable.add(key)
            return None
        leaves = pytree.tree_leaves(static_out)
        if not all(isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == size for t in leaves):
            logger.warning("model outputs have no batch dimension; CUDA graphs off for this shape")
            self.uncapturable.add(key)
            return None
        self.graphs[key] = (static_in, graph, static_out)
        logger.info("captured a CUDA graph for batch size %d", size)
        return self.graphs[key]


def _memory_format(t: torch.Tensor) -> str:
    cl = t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)
    return "channels_last" if cl and not t.is_contiguous() else "contiguous"


def _static_like(t: torch.Tensor, size: int) -> torch.Tensor:
    out = torch.zeros((size, *t.shape[1:]), dtype=t.dtype, device=t.device)
    if _memory_format(t) == "channels_last":
        out = out.contiguous(memory_format=torch.channels_last)
    return out


class CudaBackend:
    """The real CUDA calls of :class:`DevicePath`, one line each."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def new_stream(self) -> Any:
        return torch.cuda.Stream(device=self.device)

    def current_stream(self) -> Any:
        return torch.cuda.current_stream(self.device)

    def stream_scope(self, stream: Any) -> Any:
        return torch.cuda.stream(stream)

    def new_event(self) -> Any:
        return torch.cuda.Event()

    def is_host(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == "cpu"

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        tensor.record_stream(stream)

    def pin(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def h2d(self, host: torch.Tensor) -> torch.Tensor:
        return host.to(self.device, non_blocking=True)

    def d2h(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=True)

    def set_cudnn_benchmark(self, on: bool) -> None:
        torch.backends.cudnn.benchmark = on

    def capture(self, fn: Any, stream: Any) -> tuple[Any, Any]:
        """Warm up on ``stream`` (cuDNN autotuning, lazy init), then capture one call."""
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = fn()
        return graph, out
