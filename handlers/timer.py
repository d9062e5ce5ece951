"""TorchServe's ``ts.handler_utils.timer.timed``: a decorator for a handler's stage methods.

With ``handler: {profile: true}`` in model-config.yaml, each call of a decorated method records
its duration (ms) as the metric ``ts_handler_<method>`` through ``context.metrics.add_time``;
otherwise the method runs untimed. On CUDA the device is synchronized before the clock stops
(TorchServe times with CUDA events), so the time includes the kernels the method queued.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from time import perf_counter
from typing import Any

import torch


def _profiling(handler: Any) -> bool:
    context = getattr(handler, "context", None)
    config = getattr(context, "model_yaml_config", None) or {}
    section = config.get("handler") if isinstance(config, dict) else None
    return isinstance(section, dict) and bool(section.get("profile"))


def timed(func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def wrap_func(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _profiling(self):
            return func(self, *args, **kwargs)
        start = perf_counter()
        result = func(self, *args, **kwargs)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        duration = (perf_counter() - start) * 1000
        self.context.metrics.add_time("ts_handler_" + func.__name__, duration)
        return result

    return wrap_func
