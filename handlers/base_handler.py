"""TorchServe's ``BaseHandler`` shape with batch-aware per-item failures.

``handle(data, context)`` runs ``preprocess -> inference -> postprocess`` and records each stage's
duration (ms) in ``context.stage_timings``, which the Service returns with the batch.

Per-item failures: a subclass preprocesses item by item with ``self.map_items(data, fn)``. When
``fn`` raises ``PredictionException`` (e.g. ``BadInput``) for an item, that item is dropped from the
batch, its response status is set to the exception's ``error_code`` and its response body becomes
``{"code": N, "type": "<ExceptionClass>", "message": "..."}``. The remaining items run as a smaller
batch; ``postprocess`` returns one result per *remaining* item and ``handle`` re-inserts the error
bodies at the failed positions, so it always returns exactly ``len(data)`` items. If every item
fails, inference is skipped.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from time import perf_counter
from typing import Any

import torch

from .errors import (
    BadInput,
    PredictionException,
    UnprocessableInput,
    error_status,
    scrub_message,
)
from .runtime import accel, loading, pt2
from .runtime.envelopes import Undecoded
from .utils import load_label_mapping

logger = logging.getLogger(__name__)


class _AllItemsFailed(Exception):
    """Raised by map_items when no item of the batch is left to run."""


def check_decoded(item: Any) -> None:
    """Raise BadInput for a row (or an ``(index, row)`` pair) whose body or file part did not
    decode as its content type says (``Undecoded``): TorchServe hands such bytes to a handler
    raw, and so does torchbay, but its own handlers answer 400 rather than read them as data."""
    row = item[1] if isinstance(item, tuple) and len(item) == 2 else item
    for value in row.values() if isinstance(row, dict) else ():
        if isinstance(value, Undecoded):
            raise BadInput(value.reason)


def error_body(exc: PredictionException) -> dict[str, Any]:
    message = scrub_message(exc.message)
    return {"code": error_status(exc.error_code), "type": type(exc).__name__, "message": message}


class BaseHandler:
    """Loads the archive's model onto the worker's device and serves tensors through it."""

    # The CUDA calls of the device path (handlers/runtime/accel.py); None: the real ones on a CUDA
    # device, the plain path on CPU. Tests inject a recording stand-in here.
    accel_backend: Any = None

    def __init__(self) -> None:
        self.model: Any = None
        self.mapping: dict[str, str] | None = None
        self.device: torch.device | None = None
        self.initialized = False
        self.context: Any = None
        self.manifest: dict[str, Any] | None = None
        self.map_location: str | None = None
        self.model_dir: str | None = None
        # TorchServe's BaseHandler sets these too; its subclasses read them after initialize.
        self.model_pt_path: str | None = None
        self.model_yaml_config: dict[str, Any] = {}
        self.profiler_args: dict[str, Any] = {}
        self.model_input_dtype: torch.dtype = torch.float32
        self.explain = False
        self.target = 0
        self._failures: dict[int, dict[str, Any]] = {}
        self.kept_indices: list[int] = []
        self.accel_options = accel.AccelOptions()
        self._accel: Any = None

    # -- lifecycle -------------------------------------------------------------------------
    def initialize(self, context: Any) -> None:
        """Pick the device, load the model and the optional ``index_to_name.json`` mapping."""
        self.context = context
        properties = context.system_properties
        self.manifest = context.manifest
        self.model_dir = str(properties.get("model_dir"))
        self.model_yaml_config = getattr(context, "model_yaml_config", None) or {}
        serialized = (self.manifest or {}).get("model", {}).get("serializedFile")
        self.model_pt_path = os.path.join(self.model_dir, serialized) if serialized else None
        gpu_id = properties.get("gpu_id")
        if gpu_id is not None and torch.cuda.is_available():
            self.map_location = "cuda"
            self.device = torch.device(f"cuda:{gpu_id}")
        else:
            self.map_location = "cpu"
            self.device = torch.device("cpu")
        self.model = loading.load_model(self.model_dir, self.manifest, self.device)
        self.model_input_dtype = loading.model_input_dtype(self.model, self.manifest)
        # model-config.yaml's pt2 (torch.compile), as TorchServe's BaseHandler applies it.
        self.model = pt2.apply(self.model, getattr(context, "model_yaml_config", None))
        self.mapping = load_label_mapping(os.path.join(self.model_dir, "index_to_name.json"))
        self.accel_options = accel.options_from(getattr(context, "model_yaml_config", None))
        if self.model is not None:
            self._device_path()  # convert the model (channels_last, cuDNN) at load, not later
        self.initialized = True

    def _load_torchscript_model(self, model_pt_path: str) -> Any:
        """TorchServe's helper for a handler that loads its own model: a TorchScript file onto
        ``self.device``."""
        return torch.jit.load(model_pt_path, map_location=self.device)

    def _load_pickled_model(
        self, model_dir: str, model_file: str, model_pt_path: str | None
    ) -> torch.nn.Module:
        """TorchServe's helper: the one model class of ``model_file`` (inside ``model_dir``),
        built with no arguments, with the state dict at ``model_pt_path`` loaded (weights only)."""
        path = loading.inside(model_dir, model_file, "modelFile")
        model = loading.single_module_class(loading.import_file(path), model_file)()
        if model_pt_path:
            state = torch.load(model_pt_path, map_location=self.device, weights_only=True)
            model.load_state_dict(state)
        return model

    def _device_path(self) -> Any:
        """The model's device path (handlers/runtime/accel.py), rebuilt when ``self.model``
        changed."""
        path = getattr(self, "_accel", None)
        if path is None or path.model is not self.model:
            # getattr: a TorchServe-style subclass may skip __init__/initialize and set its own
            properties = getattr(getattr(self, "context", None), "system_properties", None) or {}
            path = self._accel = accel.build(
                self.model,
                getattr(self, "device", None) or "cpu",
                getattr(self, "accel_options", None),
                model_dtype=loading.model_input_dtype(self.model, getattr(self, "manifest", None)),
                batch_size=int(properties.get("batch_size") or 1),
                backend=self.accel_backend,
            )
        return path

    def run_model(self, *inputs: Any, **kwargs: Any) -> Any:
        """One batch through the model: ``inference_mode``, the model's input dtype, and on CUDA
        the device path (pinned staging, the worker's stream, optional autocast, channels_last and
        CUDA graphs, one copy back to the host). On CPU the outputs are the model's own."""
        return self._device_path().run(*inputs, **kwargs)

    # -- stages ----------------------------------------------------------------------------
    def preprocess(self, data: list[Any]) -> Any:
        return torch.as_tensor(data, device=self.device)

    def inference(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        return self.run_model(data, *args, **kwargs)

    def postprocess(self, data: Any) -> list[Any]:
        return data.tolist()

    # -- per-item failures -----------------------------------------------------------------
    def map_items(self, data: list[Any], fn: Callable[[Any], Any]) -> list[Any]:
        """``[fn(item)]`` for the items that do not raise ``PredictionException``.

        A failing item is recorded (status + error body, see the module docstring) and left out.
        Call it at most once per batch, on the full ``data`` list given to ``handle``;
        ``self.kept_indices[j]`` is then the request index of the j-th result.
        """
        out = []
        self.kept_indices = []
        for idx, item in enumerate(data):
            try:
                check_decoded(item)
                out.append(fn(item))
            except PredictionException as exc:
                self.fail_item(idx, exc)
                continue
            self.kept_indices.append(idx)
        if not out and data:
            raise _AllItemsFailed
        return out

    def fail_item(self, idx: int, exc: PredictionException) -> None:
        """Mark request ``idx`` failed with ``exc``; it is answered with the error body."""
        self._failures[idx] = error_body(exc)
        if self.context is not None:
            status = error_status(exc.error_code)
            self.context.set_response_status(status, scrub_message(exc.message), idx)

    @contextmanager
    def model_errors(self) -> Iterator[None]:
        """Around a model call: an exception of the model becomes ``model_error(exc)``."""
        try:
            yield
        except PredictionException:
            raise
        except Exception as exc:  # 422 for a request alone, else bisected by the Service
            failure = self.model_error(exc)
            if failure is exc:
                raise
            raise failure from exc

    def model_error(self, exc: Exception) -> Exception:
        """What to raise when the model raised ``exc`` on the requests map_items kept.

        With one request left, its input is one the model cannot process: UnprocessableInput
        (422, the model's message only in the log). With more, ``exc`` itself, and the Service
        re-runs the batch in halves to find the request at fault.
        """
        if len(self.kept_indices) != 1:
            return exc
        idx = self.kept_indices[0]
        rid = self.context.get_request_id(idx) if self.context is not None else None
        logger.warning("the model raised on request %s alone", rid, exc_info=exc)
        name = type(exc).__name__
        return UnprocessableInput(f"the model cannot process this input ({name}); request id {rid}")

    def _merge_failures(self, results: list[Any], n: int) -> list[Any]:
        if not self._failures:
            return results
        if not isinstance(results, list) or len(results) != n - len(self._failures):
            return results  # the Service reports the count mismatch
        it = iter(results)
        return [self._failures[i] if i in self._failures else next(it) for i in range(n)]

    # -- entry point -----------------------------------------------------------------------
    def handle(self, data: list[Any], context: Any) -> list[Any]:
        """Run the stages over one batch; returns exactly ``len(data)`` items (see module doc)."""
        self.context = context
        self._failures = {}
        timings: dict[str, float] = {}
        if hasattr(context, "stage_timings"):
            context.stage_timings = timings
        if self._is_describe():
            return [self.describe_handle()]
        start = perf_counter()
        try:
            batch = self.preprocess(data)
        except _AllItemsFailed:
            timings["preprocess"] = (perf_counter() - start) * 1000
            return [self._failures[i] for i in range(len(data))]
        t1 = perf_counter()
        timings["preprocess"] = (t1 - start) * 1000
        if self._is_explain():
            output = self.explain_handle(batch, data)
            timings["inference"] = (perf_counter() - t1) * 1000
            return self._merge_failures(output, len(data))
        output = self.inference(batch)
        t2 = perf_counter()
        timings["inference"] = (t2 - t1) * 1000
        results = self.postprocess(output)
        timings["postprocess"] = (perf_counter() - t2) * 1000
        return self._merge_failures(results, len(data))

    # -- explain / describe (TorchServe stubs) ---------------------------------------------
    def explain_handle(self, data_preprocess: Any, raw_data: list[Any]) -> list[Any]:
        """Captum-style explanations; subclasses override ``get_insights``."""
        output_explain = None
        inputs = None
        target = 0
        row = raw_data[0] if raw_data else {}
        if isinstance(row, dict):
            inputs = row.get("data") or row.get("body")
            # TorchServe's field (a form field), or inside a JSON body ({"data": ..., "target": 3})
            target = row.get("target") or (inputs.get("target") if isinstance(inputs, dict) else 0)
        output_explain = self.get_insights(data_preprocess, inputs, target)
        return output_explain

    def get_insights(self, tensor_data: Any, raw_data: Any, target: Any) -> list[Any]:
        raise PredictionException("this handler does not support explanations", 501)

    def describe_handle(self) -> str:
        """Model description returned for a request with the ``describe`` header."""
        return "{}"

    def _header(self, name: str) -> str | None:
        """The first request's header ``name``; None for an input parameter of that name (the
        context lists each as ``{"content-type": ...}``, as TorchServe's does)."""
        try:
            value = self.context.get_request_header(0, name)
        except (AttributeError, IndexError, TypeError):
            return None
        return value if isinstance(value, str) else None

    def _is_explain(self) -> bool:
        if self._header("explain"):
            self.explain = True
            return True
        return False

    def _is_describe(self) -> bool:
        return bool(self._header("describe"))
