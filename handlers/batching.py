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
