"""Load an AOTInductor ``.pt2`` package (``torchbay archive --convert aoti``) on a worker.

``torch._inductor.aoti_load_package`` returns a callable, not an ``nn.Module``: ``AotiModel``
wraps it so every handler calls it like a model. The package is compiled for one device type,
recorded in its ``*wrapper_metadata.json`` (``AOTI_DEVICE_KEY``): a CUDA package on a CPU
worker (or the reverse) is refused at load with a clear message, before torch tries to open a
shared library built for another device.

The batch dimension was compiled dynamic from 1 to ``AOTI_MAX_BATCH`` rows (archiver/aoti.py).
A larger batch (a request of many rows, or batch_size x rows) is run in chunks of at most that
many rows and the outputs concatenated, so it is served, not refused: nothing past the bound the
compiler was given ever reaches the compiled kernels.
TorchServe's BaseHandler cannot load these packages (it treats every ``.pt2`` as a
``torch.export`` program); torchbay's handlers and benchmarks/handler_raw.py can.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import torch

from ..errors import HandlerLoadError

AOTI_MAX_BATCH = 1024  # archiver/aoti.py MAX_BATCH


def package_device(path: Path) -> str | None:
    """The device type a package was compiled for (``cpu``/``cuda``), None when not recorded."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = [n for n in zf.namelist() if n.endswith("wrapper_metadata.json")]
            if not names:
                return None
            meta = json.loads(zf.read(names[0]).decode("utf-8"))
    except (zipfile.BadZipFile, OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HandlerLoadError(f"{path.name!r} is not an AOTInductor package: {exc}") from None
    key = meta.get("AOTI_DEVICE_KEY") if isinstance(meta, dict) else None
    return str(key) if key else None


def load_aoti(path: Path, device: torch.device) -> AotiModel:
    compiled_for = package_device(path)
    if compiled_for is not None and compiled_for != device.type:
        raise HandlerLoadError(
            f"{path.name!r} is an AOTInductor package compiled for {compiled_for} and this worker "
            f"runs on {device.type}: re-pack it with torchbay archive --convert aoti --device "
            f"{device.type}"
        )
    index = device.index if device.type == "cuda" and device.index is not None else -1
    try:
        runner = torch._inductor.aoti_load_package(str(path), device_index=index)
    except Exception as exc:  # a foreign platform/ISA or a damaged package
        first = next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise HandlerLoadError(f"cannot load AOTInductor package {path.name!r}: {first}") from None
    return AotiModel(runner, device)


class AotiModel:
    """A loaded package called like a model; batches past AOTI_MAX_BATCH run in chunks."""

    def __init__(self, runner: Any, device: torch.device, max_batch: int = AOTI_MAX_BATCH) -> None:
        self.runner = runner
        self.device = device
        self.max_batch = max_batch

    def eval(self) -> AotiModel:  # handlers written for nn.Module call it
        return self

    def __call__(self, *args: Any) -> Any:
        rows = args[0].shape[0] if args and isinstance(args[0], torch.Tensor) else 0
        if rows <= self.max_batch:
            return self.runner(*args)
        parts = [
            self.runner(*(a[start : start + self.max_batch] for a in args))
            for start in range(0, rows, self.max_batch)
        ]
        return _concat(parts)


def _concat(parts: list[Any]) -> Any:
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts)
    if isinstance(first, list | tuple):
        return type(first)(_concat([p[i] for p in parts]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: _concat([p[k] for p in parts]) for k in first}
    raise HandlerLoadError(f"cannot join the chunked outputs of type {type(first).__name__}")
