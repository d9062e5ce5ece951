"""Devices without torch: count the visible GPUs, assign workers to GPUs, list usable cores.

GPU assignment follows TorchServe's ``WorkLoadManager.addThreads`` (anchors 1.10):

* a model without ``device_ids`` takes the next GPU of one server-wide counter shared by every
  worker of every model and version (round robin over all workers);
* a model with ``device_ids`` has its own counter and takes ``device_ids[0]``, ``[1]``, ... in turn;
* ``device_type="cpu"``, or any type on a host without GPUs, gives ``None`` (CPU): as
  TorchServe's ``Model``, a ``gpu`` model where no GPU is visible runs on the CPU (logged once).

Deliberate difference: torchbay's global counter starts at GPU 0. TorchServe pre-increments, so
its first worker lands on GPU 1 (workers 1, 0, 1, 0 on two GPUs).

The id is the index among the GPUs visible to the server (after ``CUDA_VISIBLE_DEVICES``); the
worker inherits the server's mask and uses ``cuda:<id>``.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence

from torchbay.server.errors import ConfigError

log = logging.getLogger("torchbay.devices")

_SMI_TIMEOUT_S = 5.0


def detect_gpu_count(
    env: Mapping[str, str], *, physical: Callable[[Mapping[str, str]], int] | None = None
) -> int:
    """GPUs this process may use: the physical count (NVML, else ``nvidia-smi -L``, else 0)
    narrowed by ``CUDA_VISIBLE_DEVICES`` from ``env`` as CUDA narrows it for the workers, who
    inherit the mask. ``physical`` replaces the probe (tests)."""
    mask = env.get("CUDA_VISIBLE_DEVICES")
    listed = None if mask is None else _mask_entries(mask)
    if listed is not None and not listed:
        return 0  # don't even probe: the user hid every GPU
    count = (physical or _physical_gpu_count)(env)
    if listed is None or count == 0:
        return count
    if isinstance(listed[0], str):  # UUIDs: which exist is NVML's to say; at most them all
        return min(count, len(listed))
    # An ordinal past the physical GPUs ends the list (``0,5`` on two GPUs is one GPU).
    return next((i for i, ordinal in enumerate(listed) if ordinal >= count), len(listed))


def _mask_entries(mask: str) -> list[int] | list[str]:
    """The devices a ``CUDA_VISIBLE_DEVICES`` value lists, read as CUDA reads it (and torch's
    ``torch.cuda._parse_visible_devices``): UUIDs (``GPU-``/``MIG-``) up to the first entry of
    another form; else ordinals by their leading digits (``1gpu`` is 1) up to the first entry
    that has none (``-1``, ``x``, empty); a repeated entry hides every GPU."""
    if mask.startswith(("GPU-", "MIG-")):
        prefix = mask[:4]
        uuids: list[str] = []
        for entry in (e.strip() for e in mask.split(",")):
            if not entry.startswith(prefix):
                break
            if entry in uuids:
                return []
            uuids.append(entry)
        return uuids
    ordinals: list[int] = []
    for entry in mask.split(","):
        digits = re.match(r"\+?([0-9]+)", entry.strip())
        if digits is None:
            break
        ordinal = int(digits[1])
        if ordinal in ordinals:
            return []
        ordinals.append(ordinal)
    return ordinals


def _physical_gpu_count(env: Mapping[str, str]) -> int:
    count = _nvml_count()
    return count if count is not None else _smi_count(env)


def _nvml_count() -> int | None:
    try:
        import pynvml  # nvidia-ml-py, optional (torchbay[gpu])
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None  # no driver: fall back to nvidia-smi (it will say the same, cheaply)
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def _smi_count(env: Mapping[str, str]) -> int:
    exe = shutil.which("nvidia-smi", path=env.get("PATH"))
    if exe is None:
        return 0
    try:
        out = subprocess.run(
            [exe, "-L"], capture_output=True, text=True, timeout=_SMI_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if out.returncode != 0:
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


class DeviceAssigner:
    """Hands out a GPU id (or None for CPU) per worker start. One per server; thread-safe."""

    def __init__(self, gpu_count: int) -> None:
        if gpu_count < 0:
            raise ValueError("gpu_count must be >= 0")
        self.gpu_count = gpu_count
        self._next_global = 0
        self._per_model: dict[str, int] = {}
        self._warned: set[str] = set()  # gpu models placed on the CPU, logged once each
        self._lock = threading.Lock()

    def assign(
        self, model_key: str, device_type: str, device_ids: Sequence[int] | None
    ) -> int | None:
        """The device for the next worker of ``model_key`` (e.g. ``"name/version"``)."""
        if device_type == "cpu":
            return None
        if self.gpu_count == 0:
            if device_type == "gpu" and model_key not in self._warned:
                self._warned.add(model_key)
                log.warning("model %s: deviceType gpu, but no GPU is visible: CPU", model_key)
            return None
        with self._lock:
            if device_ids:
                bad = [i for i in device_ids if not 0 <= i < self.gpu_count]
                if bad:
                    raise ConfigError(
                        f"model {model_key}: deviceIds {bad} out of range "
                        f"({self.gpu_count} visible GPUs: 0..{self.gpu_count - 1})"
                    )
                n = self._per_model.get(model_key, 0)
                self._per_model[model_key] = n + 1
                return device_ids[n % len(device_ids)]
            gpu = self._next_global % self.gpu_count
            self._next_global += 1
            return gpu

    def forget(self, model_key: str) -> None:
        """Drop a model's per-model counter (after it is unregistered)."""
        with self._lock:
            self._per_model.pop(model_key, None)
            self._warned.discard(model_key)


def usable_cores(count: int | None = None) -> tuple[int, ...]:
    """The ids of the cores this process may run on (``os.sched_getaffinity``), sorted.

    ``count`` (tests, or a caller that knows better) takes the first ``count`` of them, or
    ``0..count-1`` when the process may use fewer. CPU threads are sized by serving/budget.py."""
    if hasattr(os, "sched_getaffinity"):
        ids = tuple(sorted(os.sched_getaffinity(0)))
    else:
        ids = tuple(range(os.cpu_count() or 1))
    if count is None:
        return ids
    return ids[:count] if len(ids) >= count else tuple(range(count))
