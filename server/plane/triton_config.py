"""A model version as Triton's model configuration shows it (``GET /v2/models/{m}/config``, gRPC
``ModelConfig``; ``models.py`` serves it and a repository load takes it back), and the tensor
signature its metadata and configuration show: the archive's, without the sequence control
inputs the server fills. Torch-free.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from torchbay.server.plane import json_members
from torchbay.server.plane.schedule import json_header, queue_policies
from torchbay.server.plane.sequence_params import without_controls
from torchbay.server.serving import protocol as p
from torchbay.server.serving.archives import ArchiveError, Signature, TensorSpec, signature_of
from torchbay.server.serving.model import ModelVersion

_SHAPES = re.compile(rb'"shape"\s*:\s*\[\s*([0-9]+)')  # each shape's first number, written plainly


def signature(mv: ModelVersion) -> Signature | None:
    """The version's signature as clients send it (validated at registration: cannot fail)."""
    try:
        sig = signature_of(mv.manifest, mv.config.handler_config)
    except ArchiveError:
        return None
    return without_controls(sig, mv.config.handler_config)


def batched(mv: ModelVersion) -> bool:
    """Whether the version's configuration shows a batch dimension (``max_batch_size`` > 0):
    its inputs all have one first, or nothing describes them."""
    return (signature(mv) or Signature()).batched


def inferences(mv: ModelVersion, wires: Iterable[p.WireRequest], limit: int) -> int:
    """Triton's ``inference_count`` of the requests a worker ran (``wires``), where "each
    inference in a batched request is counted": an OIP request to a model that batches
    (``max_batch_size`` > 0) counts its first input's first dimension; any other, one."""
    counted = 0
    for wire in wires:
        rows = _rows(wire, limit) if wire.protocol == "v2" else 1
        counted += rows if rows == 1 or batched(mv) else 1
    return counted


def _rows(wire: p.WireRequest, limit: int) -> int:
    """An OIP request's first input's first dimension (1 where it has none). A byte search
    first: where no ``"shape"`` of the JSON starts with a number over 1, it is 1 (a request
    of one row, the most common, costs ~1 µs a kilobyte instead of the walk's ~10)."""
    head = json_header(wire, limit)
    if b"\\u" not in head and all(first in (b"0", b"1") for first in _SHAPES.findall(head)):
        return 1
    try:
        dim = json_members.at_path(head, ("inputs", 0, "shape", 0))
    except (ValueError, RecursionError):
        return 1
    return dim if type(dim) is int and dim > 0 else 1


def platform(mv: ModelVersion) -> str:
    info = getattr(mv.manifest, "torchbay", None)
    return f"pytorch_{getattr(info, 'format', None) or 'torchscript'}"


def _config_tensor(spec: TensorSpec, batched: bool) -> dict[str, Any]:
    """A tensor of Triton's model configuration: ``dims`` without the batch dimension when the
    model takes one (``max_batch_size`` > 0), its whole shape otherwise."""
    dims = spec.shape[1:] if batched and spec.shape[:1] == [-1] else spec.shape
    # model_config.proto names BYTES TYPE_STRING (there is no TYPE_BYTES: gRPC dropped it)
    data_type = "TYPE_STRING" if spec.datatype == "BYTES" else f"TYPE_{spec.datatype}"
    tensor = {"name": spec.name, "data_type": data_type, "dims": dims}
    if spec.format is not None:
        tensor["format"] = spec.format
    return tensor


def model_config(mv: ModelVersion) -> dict[str, Any]:
    """A Triton ModelConfig JSON of the version: the batch dimension is implicit in ``dims``."""
    sig = signature(mv) or Signature()
    settings = mv.settings
    gpu = any(s.worker is not None and s.worker.device.startswith("cuda") for s in mv.slots)
    # Triton's max_batch_size 0: a model whose inputs have no batch dimension (a leading -1)
    batched = sig.batched
    cache = getattr(mv.config, "response_cache", None)
    config: dict[str, Any] = {
        "name": mv.name,
        "platform": platform(mv),
        "backend": "pytorch",
        "version_policy": {"specific": {"versions": [mv.version]}},
        "max_batch_size": settings.batch_size if batched else 0,
        "input": [_config_tensor(s, batched) for s in sig.inputs],
        "output": [_config_tensor(s, batched) for s in sig.outputs],
        "instance_group": [
            {
                "name": mv.name,
                "kind": "KIND_GPU" if gpu else "KIND_CPU",
                "count": settings.min_workers,
            }
        ],
        "response_cache": {"enable": bool(cache is not None and cache.enable)},
    }
    if settings.sequence_mode:  # Triton's clients (perf_analyzer) tell a sequence model by it
        config["sequence_batching"] = sequence_batching(mv)
    elif batched or mv.queue.levels is not None:
        # None without a batch dimension (each request runs alone, the worker's rule) unless
        # the model has priority levels or a queue policy: Triton's dynamic batcher schedules
        # a max_batch_size 0 model too, and its configuration shows them.
        config["dynamic_batching"] = {
            "max_queue_delay_microseconds": int(settings.max_batch_delay_ms * 1000),
            **queue_policies(mv.config, settings.job_queue_size),
        }
    return config


def sequence_batching(mv: ModelVersion) -> dict[str, Any]:
    """A sequence model's ``sequence_batching``: its strategy with the batch delay, its idle
    limit (left out when 0: a Triton sequence then idles for Triton's default, 1 s, which is
    what Triton reads from a field left out; serving/sequence_ends.py) and the control inputs
    its model-config.yaml declares (the server fills them; model_config.proto's form)."""
    settings = mv.settings
    delay = {"max_queue_delay_microseconds": int(settings.max_batch_delay_ms * 1000)}
    section: dict[str, Any] = {settings.sequence_strategy: delay}
    if settings.sequence_max_idle_ms:
        section["max_sequence_idle_microseconds"] = settings.sequence_max_idle_ms * 1000
    declared = (mv.config.handler_config or {}).get("sequence_batching")
    controls = declared.get("control_input") if isinstance(declared, dict) else None
    if isinstance(controls, list) and controls:
        section["control_input"] = controls
    return section
