"""Batch assembly into host buffers reused across batches (the tensor handler's hot path).

``BatchBuffers.assemble(parts)`` concatenates per-request tensors (first dimension = samples)
along dim 0 into a buffer kept per (sample shape, dtype) and grown to the largest batch seen, so a
steady load allocates nothing per batch; a single part is passed through without a copy. The
returned batch is valid until the next ``assemble`` of the same key: a handler turns the model's
outputs into lists or arrays before the next batch, and ``detach_from`` copies any output that
aliases the buffer (an identity-like model) so it outlives the batch.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from .errors import PredictionException

MAX_KEYS = 4  # distinct (sample shape, dtype) buffers kept; the least recently used goes first


class BatchBuffers:
    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self.max_keys = max_keys
        self._buffers: OrderedDict[tuple, torch.Tensor] = OrderedDict()

    def assemble(self, parts: list[torch.Tensor]) -> torch.Tensor:
        if len(parts) == 1:
            return parts[0].contiguous()
        first = parts[0]
        key = (tuple(first.shape[1:]), first.dtype, first.device)
        total = sum(p.shape[0] for p in parts)
        buf = self._buffers.pop(key, None)
        if buf is None or buf.shape[0] < total:
            buf = torch.empty((total, *first.shape[1:]), dtype=first.dtype, device=first.device)
        self._buffers[key] = buf
        while len(self._buffers) > self.max_keys:
            self._buffers.popitem(last=False)
        return torch.cat(parts, out=buf[:total])

    def detach_from(self, batch: torch.Tensor, outputs: list) -> list:
        """``outputs`` with each tensor that shares storage with ``batch`` cloned."""
        ptr = batch.untyped_storage().data_ptr()
        return [
            o.clone()
            if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() == ptr
            else o
            for o in outputs
        ]


def check_tensors(names: list[str], outputs: list[object]) -> None:
    """A 500 naming the first output that is not a tensor (a nested tuple, None, a number): the
    tensor handler answers a tensor, or a tuple, list or dict of tensors."""
    for name, out in zip(names, outputs, strict=True):
        if not isinstance(out, torch.Tensor):
            raise PredictionException(
                f"the model's output {name!r} is a {type(out).__name__}, not a tensor: the "
                "tensor handler answers a tensor, or a tuple, list or dict of tensors",
                500,
            )


def split_rows(
    names: list[str], outputs: list[torch.Tensor], counts: list[int]
) -> list[list[torch.Tensor]]:
    """Each request's rows of every output (``counts``: the requests' rows, in batch order).

    An output whose first dimension is not the batch's rows (a scalar, a table the model returns
    whole) has no per-request part: slicing it would answer each request a wrong piece, so the
    batch fails with a 500 that names the output (the model's fault, not the request's).
    """
    rows = sum(counts)
    for name, out in zip(names, outputs, strict=True):
        if out.dim() == 0 or out.shape[0] != rows:
            raise PredictionException(
                f"the model's output {name!r} of shape {list(out.shape)} has no batch dimension "
                f"(the batch has {rows} row(s)): a batched model returns every output with one "
                "row per input row",
                500,
            )
    starts = [sum(counts[:i]) for i in range(len(counts))]
    return [[out[s : s + n] for out in outputs] for s, n in zip(starts, counts, strict=True)]
