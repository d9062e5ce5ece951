"""The management API's describe-model object: TorchServe's fields, plus what torchbay knows
beyond them (restarts, recycles, placement, format). The model settings in it are those declared
with a describe key in ``config.model_settings``, each in its section."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from typing import Any

import psutil
from pydantic import BaseModel

from torchbay.server.config.model_settings import SETTINGS, ModelConfig, Section, Setting
from torchbay.server.errors import HandlerFailed, NoWorker
from torchbay.server.plane.models import signature
from torchbay.server.serving.archives import Signature
from torchbay.server.serving.handle import WorkerState
from torchbay.server.serving.model import ModelVersion
from torchbay.server.serving.multiplex import Multiplexer
from torchbay.server.serving.protocol import WireRequest
from torchbay.server.serving.queue import Pending
from torchbay.server.serving.registry import ModelRegistry
from torchbay.server.serving.sequences import SequenceQueue
from torchbay.server.serving.slot import WorkerSlot


def _rss(pid: int | None) -> int:
    if pid is None:
        return 0
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except (psutil.Error, OSError):
        return 0  # the worker just exited


_LOADED = (WorkerState.READY, WorkerState.BUSY)


def _worker(slot: WorkerSlot) -> dict[str, Any]:
    w = slot.worker
    pid = w.pid if w else None
    started = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(w.start_time)) if w else None
    return {
        "id": str(w.id if w else slot.index),
        "startTime": started,
        # TorchServe's two values: READY (loaded, idle or running a request), else UNLOADING
        "status": "READY" if slot.state in _LOADED else "UNLOADING",
        "state": slot.state.value,  # torchbay's: STARTING, READY, BUSY, DRAINING, STOPPED, FAILED
        "memoryUsage": _rss(pid),
        "pid": pid,
        "gpu": slot.placement.gpu_id is not None,
        "gpuUsage": "N/A",
        "device": w.device if w else None,
        "threads": (w.own_threads if w else None) or slot.placement.threads,
        "cpuAffinity": list(slot.placement.cpu_affinity or ()) or None,  # None: not pinned
        "restarts": slot.restarts,
        "startFailures": slot.start_failures,
        "recycles": slot.recycles,
    }


# TorchServe 0.12's describe fields for features torchbay does not have, at its values for a
# model without them (parallelism, job tickets, venvs).
_TS_FIXED = {
    "parallelType": "",
    "parallelLevel": 0,
    "useJobTicket": False,
    "useVenv": False,
    "stateful": False,
}


def described(
    settings: Mapping[str, Setting], live: Any, config: ModelConfig | None, section: Section
) -> dict[str, Any]:
    """The described settings of one section, by describe key: the running version's value
    (``live``, its ModelSettings) where it reads the setting, else the resolved config's (the
    default without one)."""
    shown = {}
    for setting in settings.values():
        if setting.describe is None or setting.section != section:
            continue
        source = live if setting.serving else config
        value = getattr(source, setting.name, setting.default)
        # A nested setting (responseCache) is shown by its model-config.yaml keys.
        shown[setting.describe] = (
            value.model_dump(by_alias=True) if isinstance(value, BaseModel) else whole_number(value)
        )
    return shown


def whole_number(value: Any) -> Any:
    """A whole number as an integer: settings that take decimals (milliseconds, seconds) are
    floats here, and TorchServe's describe and snapshots have integers (``"maxBatchDelay":
    100``), which a client decoding into an integer field (Go, serde) cannot take as ``100.0``."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _tensors(mv: ModelVersion) -> dict[str, Any]:
    """The tensors the model declares (its OIP metadata's ``inputs``/``outputs``: an fp16
    archive's are FP16) and whether requests are batched along a first dimension (False: each
    runs alone, whatever ``batchSize`` says)."""
    sig = signature(mv) or Signature()
    return {**sig.to_json(), "batched": sig.batched}


def runtime_of(mv: ModelVersion) -> str:
    """The version's runtime as TorchServe keeps it: the registration's ``runtime``, else the
    manifest's (describe's ``runtime``, a snapshot's ``runtimeType``)."""
    return mv.runtime or getattr(mv.manifest, "runtime", None) or "python"


def describe(registry: ModelRegistry, mv: ModelVersion) -> dict[str, Any]:
    """TorchServe's describe-model object, plus what torchbay knows beyond it."""
    config = registry.model_configs.get(mv.key)
    info = getattr(mv.manifest, "torchbay", None)
    return {
        "modelName": mv.name,
        "modelVersion": mv.version,
        "modelUrl": mv.url,
        "runtime": runtime_of(mv),
        **described(SETTINGS, mv.settings, config, "batching"),  # workers, batching, timeouts
        **mv.admission.describe(),  # maxQueueDelayMs, the service rate, rejections by reason
        **_device(registry, mv, config),
        "status": mv.status.value,
        "loadError": mv.load_error,
        "workerRestarts": mv.restarts,
        "workerStartFailures": mv.start_failures,
        "workerRecycles": mv.recycles,
        **described(SETTINGS, mv.settings, config, "workers"),  # recycling
        "loadedAtStartup": mv.key in registry.startup_models,
        # max_loaded_models: loaded or not, loads, evictions, last used (serving/multiplex.py)
        **(registry.multiplexer.describe(mv) if registry.multiplexer is not None else {}),
        "isDefault": registry.is_default(mv),
        "workers": [_worker(slot) for slot in mv.slots],
        "metrics": {
            "rejectedRequests": mv.requests_rejected,
            "waitingQueueSize": len(mv.queue),
            "requests": mv.requests_received,
        },
        "jobQueueStatus": {
            "remainingCapacity": mv.queue.remaining_capacity,
            "pendingRequests": len(mv.queue),
        },
        **_TS_FIXED,
        **described(SETTINGS, mv.settings, config, "sequences"),  # TorchServe's, then Triton's
        **_sequences(mv),
        "format": getattr(info, "format", None),
        "precision": getattr(info, "precision", None),
        **_tensors(mv),
        "threadBudget": registry.budget.summary(),  # the host's, over all models (budget.py)
        "autopilot": mv.autopilot.describe(),  # sla_p99_ms: current batching beside the ceilings
    }


async def customized(mv: ModelVersion) -> Any:
    """``?customized=true``: what the handler answers a request with TorchServe's ``describe:
    True`` header (BaseHandler's ``describe_handle``), JSON-decoded when it is JSON, as
    TorchServe's ``customizedMetadata``. The request runs on a worker in a batch of its own
    (handlers.runtime.service); without one, TorchServe's 503 for a describe request. A version
    that loads on demand (max_loaded_models) and is not loaded is that 503 too: a read loads
    nothing (its load would unload another model to make room)."""
    wire = WireRequest(request_id=uuid.uuid4().hex, body=b"", raw_headers=b"describe: True")
    try:
        if mv.demand is not None and not Multiplexer.loaded(mv):
            raise NoWorker("not loaded")
        answers = [response async for response in mv.stream(wire, _uncounted)]
    except NoWorker:
        raise NoWorker(
            f'Model "{mv.name}" has no worker to serve describe request. '
            "Please use scale workers API to add workers."
        ) from None
    if not answers or answers[-1].status >= 400:
        status = answers[-1].status if answers else "none"
        raise HandlerFailed(f'Model "{mv.name}" failed to describe itself (status {status})')
    text = b"".join(response.body for response in answers).decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def _uncounted(item: Pending) -> None:
    """A describe is no inference: no batch metric, statistic or service rate counts it."""
    item.counted = False


def _device(
    registry: ModelRegistry, mv: ModelVersion, config: ModelConfig | None
) -> dict[str, Any]:
    """TorchServe's ``deviceType`` and ``deviceIds`` as its Model settles them: ``gpu`` where the
    server has GPUs and the model does not ask for the CPU (``auto`` included), else ``cpu``; the
    ids only where there are GPUs to name (tests/data/torchserve/devices)."""
    declared = described(SETTINGS, mv.settings, config, "device")
    gpus = registry.gpus > 0
    on_gpu = gpus and declared["deviceType"] != "cpu"
    return {
        "deviceType": "gpu" if on_gpu else "cpu",
        "deviceIds": declared["deviceIds"] if gpus else None,
    }


def _sequences(mv: ModelVersion) -> dict[str, Any]:
    """A sequence model's open sequences and ended ones by reason (serving/sequences.py)."""
    if not isinstance(mv.queue, SequenceQueue):
        return {}
    return {"stateful": True, **mv.queue.describe()}  # TorchServe's "stateful": a sequence model
