"""The ``tensor`` built-in handler: tensors in, the model's output as JSON out.

Input per request (the ``body``, or a form field ``data``):
  * ``.npy`` bytes (``\\x93NUMPY`` magic; loaded with ``allow_pickle=False``);
  * raw little-endian float32 bytes (``application/octet-stream``);
  * JSON nested lists (``[[...]]``), or an object ``{"data": ...}`` / ``{"input": ...}``, or
    ``{"instances": [...]}`` (a list of samples).
Per-sample shape: the manifest's ``torchbay.input_shape``, else the request header
``x-input-shape: 1,28,28``. Raw float32 without any shape is 1-D. A request holds one sample (its
shape equals the per-sample shape) or several (shape ``[n, *sample_shape]``); with no known shape
the whole input is one sample. Inputs are cast to the model's dtype (fp16/bf16 archives) unless
the header ``x-input-dtype`` (e.g. ``int64``) or the manifest's ``torchbay.input_dtype`` names an
integer type. Requests whose samples share a shape are batched together.

Output per request: ``{"output": <nested lists>}``: the model's output for the one sample, or a
list of per-sample outputs for several; a model returning a tuple gives a list of such outputs.

Open Inference Protocol (v2) natively: each input tensor is the numpy array ``handlers.runtime.oip``
decoded (JSON or binary, used in place when already in the model's dtype; its first dimension is
the batch), passed to the model positionally in the signature's order (the Service matched them by
name; without a signature, the request's order); each output comes back as ``{"name", "shape",
"datatype", "array"}`` in the floating datatype the signature declares, else its own dtype
(FP16/BF16 included), named by the signature (a dict output by its keys), else output0, output1...

A model whose signature has no batch dimension (``Signature.batched`` false: Triton's
``max_batch_size: 0``) takes each request's tensors whole, OIP or TorchServe-style: requests are
never concatenated, each runs alone, and its outputs are answered as the model returns them.

Errors: an undecodable input is 400 (``BadInput``); a well-formed input the model cannot process
is 422 (``UnprocessableInput``): its shape differs from the manifest's ``input_shape``, its v2
datatype has no tensor type, or the model raised on it alone. When the model raises on a group of
several requests the exception propagates, and the Service re-runs the batch in halves until the
request that causes it runs alone. The model's own message (a TorchScript traceback with file
paths) only goes to the worker log.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import warnings
from typing import Any

import numpy as np
import torch

from .base_handler import BaseHandler
from .batching import BatchBuffers, check_tensors, split_rows
from .errors import BadInput, PredictionException, UnprocessableInput
from .oip_signature import load as load_signature
from .oip_signature import output_names
from .tensor_bodies import load_npy, npy_tensor, parse_shape
from .utils import torchbay_info

# torch's dtype names a manifest's input_dtype may give (aliases included)
_DTYPE_NAMES = (
    "float32 float float16 half bfloat16 float64 int64 long int32 int int16 int8 uint8 bool"
)
_DTYPES = {name: getattr(torch, name) for name in _DTYPE_NAMES.split()}
_WIDER = {"UINT16": np.int32, "UINT32": np.int64, "UINT64": np.int64}  # torch lacks the ops
_V2_DTYPES = {
    "BOOL": torch.bool,
    "UINT8": torch.uint8,
    **{f"INT{bits}": getattr(torch, f"int{bits}") for bits in (8, 16, 32, 64)},
    **{f"FP{bits}": getattr(torch, f"float{bits}") for bits in (16, 32, 64)},
    "BF16": torch.bfloat16,
    **{name: getattr(torch, wider.__name__) for name, wider in _WIDER.items()},
}
_FLOATING = frozenset({"FP16", "FP32", "FP64", "BF16"})
# A torch dtype's OIP name: the wider stand-ins above map back to their own (signed) names, and
# a model's own unsigned outputs keep theirs (the datatype the archiver declares for them).
_V2_NAMES = {dtype: name for name, dtype in _V2_DTYPES.items() if name not in _WIDER}
_V2_NAMES.update({getattr(torch, name.lower()): name for name in _WIDER})
logger = logging.getLogger(__name__)
_OUT_OF_MEMORY = (MemoryError, getattr(torch, "OutOfMemoryError", MemoryError))


class TensorHandler(BaseHandler):
    """Generic tensor-in/JSON-out handler (see the module docstring for formats)."""

    supports_v2 = True

    def initialize(self, context: Any) -> None:
        super().initialize(context)
        info = torchbay_info(self.manifest or {})
        shape = info.get("input_shape")
        self.input_shape: list[int] | None = [int(d) for d in shape] if shape else None
        declared = _DTYPES.get(str(info.get("input_dtype") or "").lower())
        # Integer inputs (token ids) keep their dtype; float inputs follow the model's precision.
        self.declared_dtype = (
            declared if declared is not None and not declared.is_floating_point else None
        )
        self.signature = load_signature(
            self.manifest or {}, getattr(context, "model_yaml_config", None)
        )
        # Inputs without a batch dimension (Triton's max_batch_size 0): each request's tensors
        # are the model's whole inputs, run alone and answered whole.
        self.unbatched = self.signature is not None and not self.signature.batched
        if self.unbatched and self.accel_options.cuda_graphs:
            # CUDA graphs pad a batch's first dimension up to a captured size: a whole input has
            # no batch dimension to pad. The device path is rebuilt without them on first use.
            self.accel_options = dataclasses.replace(self.accel_options, cuda_graphs=False)
            self._accel = None

    # -- preprocess: one entry per remaining request: (inputs, single) --------------------------
    def preprocess(self, data: list[Any]) -> list[tuple[list[torch.Tensor], bool]]:
        # What postprocess needs of the rows, not the rows: a batch's inputs (a client's CUDA
        # shared memory among them) are not kept alive past their batch.
        self._v2_rows = [isinstance(row, dict) and row.get("protocol") == "v2" for row in data]
        items = self.map_items(list(enumerate(data)), self._item)
        self._single = [single for _, single in items]
        return items

    def _item(self, pair: tuple[int, dict[str, Any]]) -> tuple[list[torch.Tensor], bool]:
        idx, row = pair
        if not isinstance(row, dict):
            raise BadInput("request row is not a dict")
        if row.get("protocol") == "v2":
            return [self._v2_tensor(t) for t in row["body"]["inputs"]], False
        value = row.get("data") if row.get("data") is not None else row.get("body")
        if self.unbatched:
            tensor = self._to_tensor(value, None)
            return [tensor.to(dtype=self._target_dtype(idx, tensor))], False
        shape = self.input_shape
        header = self._request_header(idx, "x-input-shape")
        if header:
            shape = parse_shape(header)
        # A mismatch with the manifest's shape is the model's limit (422); with the client's own
        # header, a contradictory request (400).
        mismatch = BadInput if header else UnprocessableInput
        tensor = self._to_tensor(value, shape)
        dtype = self._target_dtype(idx, tensor)
        tensor = tensor.to(dtype=dtype)  # run_model moves the batch in one copy
        if shape is None:
            return [tensor.unsqueeze(0)], True
        if list(tensor.shape) == shape:
            return [tensor.unsqueeze(0)], True
        if tensor.dim() == len(shape) + 1 and list(tensor.shape[1:]) == shape:
            return [tensor], False
        if tensor.numel() == math.prod(shape):
            return [tensor.reshape(1, *shape)], True
        raise mismatch(f"input of shape {list(tensor.shape)} does not match sample shape {shape}")

    def _request_header(self, idx: int, name: str) -> str | None:
        try:
            value = self.context.get_request_header(idx, name)
        except (AttributeError, IndexError, TypeError):
            return None
        return value if isinstance(value, str) else None  # not an input parameter's entry

    def _target_dtype(self, idx: int, tensor: torch.Tensor) -> torch.dtype:
        header = self._request_header(idx, "x-input-dtype")
        if header:
            dtype = _DTYPES.get(header.strip().lower())
            if dtype is None:
                raise BadInput(f"unknown x-input-dtype {header!r}")
            return self.model_input_dtype if dtype.is_floating_point else dtype
        return self.declared_dtype or self.model_input_dtype

    def _to_tensor(self, value: Any, shape: list[int] | None) -> torch.Tensor:
        if isinstance(value, (bytes, bytearray, memoryview)):
            # One copy of the body (np.frombuffer reads bytes, bytearray or a frame's view).
            view = memoryview(value).cast("B")
            if view[:6] == b"\x93NUMPY":
                return npy_tensor(load_npy(view.tobytes()))
            if not view.nbytes or view.nbytes % 4:
                raise BadInput(
                    f"raw float32 body must be a non-empty multiple of 4 bytes, got {view.nbytes}"
                )
            flat = torch.from_numpy(np.frombuffer(view, dtype="<f4").copy())
            if shape is not None and flat.numel() % math.prod(shape) == 0:
                n = flat.numel() // math.prod(shape)
                return flat.reshape(*shape) if n == 1 else flat.reshape(n, *shape)
            return flat
        if isinstance(value, str):
            raise BadInput("text input: send JSON (application/json), .npy or raw float32 bytes")
        if isinstance(value, dict):
            for key in ("data", "input", "inputs", "instances"):
                if key in value:
                    return self._to_tensor(value[key], shape)
            raise BadInput("JSON object input needs a 'data', 'input' or 'instances' key")
        try:
            return torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
            raise BadInput(f"JSON input is not a rectangular numeric array: {exc}") from exc

    def _v2_tensor(self, spec: dict[str, Any]) -> torch.Tensor:
        """The tensor of one OIP input (``spec["array"]``, decoded by ``oip``), with no copy
        when it is in the model's dtype already (``_shared``)."""
        datatype, array = spec["datatype"], spec["array"]
        if datatype not in _V2_DTYPES:
            raise UnprocessableInput(
                f"v2 datatype {datatype} is not supported by the tensor handler"
            )
        if isinstance(array, torch.Tensor):  # in CUDA shared memory: on its GPU, no copy
            tensor = array.to(_V2_DTYPES[datatype]) if datatype in _WIDER else array
        else:
            name = None if spec.get("control") else spec["name"]  # controls.py: not checked
            tensor = _host_tensor(array, datatype, name)
        if not self.unbatched and tensor.dim() == 0:  # (was the model's IndexError: a 422)
            raise BadInput(
                f"v2 input {spec['name']!r} has shape []: the model takes a batch, so its "
                "inputs need a first (batch) dimension, e.g. shape [1]"
            )
        sample = list(tensor.shape[1:])
        if (
            not self.unbatched  # the signature checked the whole shape
            and self.input_shape is not None
            and len(self.input_shape) == len(sample)
            and sample != self.input_shape
        ):
            raise UnprocessableInput(
                f"v2 input {spec['name']!r}: sample shape {sample} is not the model's "
                f"{self.input_shape}"
            )
        dtype = self.model_input_dtype if tensor.is_floating_point() else tensor.dtype
        return tensor.to(dtype=dtype)  # run_model moves the batch to the device

    # -- inference: group requests whose inputs share trailing shapes ---------------------------
    def inference(
        self, data: list[tuple[list[torch.Tensor], bool]], *args: Any, **kwargs: Any
    ) -> list[Any]:
        groups: dict[tuple, list[int]] = {}
        for j, (inputs, _) in enumerate(data):
            key = tuple((tuple(t.shape[1:]), t.dtype) for t in inputs)
            if self.unbatched:  # never concatenated: each request is a run of its own
                key = (j, *key)
            groups.setdefault(key, []).append(j)
        outputs: list[Any] = [None] * len(data)
        for members in groups.values():
            try:
                self._run_group(data, members, outputs, args, kwargs)
            except PredictionException:
                raise
            except Exception as exc:
                if len(members) > 1:
                    raise  # the Service bisects the batch to find the request(s) at fault
                self._model_failed(self.kept_indices[members[0]], exc)
        return outputs

    def _model_failed(self, idx: int, exc: Exception) -> None:
        """The model raised on request ``idx`` alone: 422 (413 when it ran out of memory)."""
        rid = self.context.get_request_id(idx) if self.context is not None else None
        logger.warning("the model raised on request %s alone", rid, exc_info=exc)
        name = type(exc).__name__
        if isinstance(exc, _OUT_OF_MEMORY):
            failure: PredictionException = PredictionException(
                f"the model ran out of memory on this input ({name}); request id {rid}", 413
            )
        else:
            failure = UnprocessableInput(
                f"the model cannot process this input ({name}); request id {rid}"
            )
        self.fail_item(idx, failure)

    def _run_group(
        self, data: list[Any], members: list[int], outputs: list[Any], args: Any, kwargs: Any
    ) -> None:
        n_inputs = len(data[members[0]][0])
        buffers = self._buffers_for(n_inputs)
        batch = [buffers[k].assemble([data[j][0][k] for j in members]) for k in range(n_inputs)]
        result = self.run_model(*batch, *args, **kwargs)  # BaseHandler's device path
        names, results = self._named(result)
        check_tensors(names, results)
        for k in range(n_inputs):  # an output aliasing a reused buffer must outlive the batch
            results = buffers[k].detach_from(batch[k], results)
        multi = isinstance(result, (tuple, list, dict))
        if self.unbatched:  # one request: its outputs are whole, no batch axis to split
            outputs[members[0]] = (results, multi, names)
            return
        counts = [data[j][0][0].shape[0] for j in members]
        for j, rows in zip(members, split_rows(names, results, counts), strict=True):
            outputs[j] = (rows, multi, names)

    def _buffers_for(self, n_inputs: int) -> list[BatchBuffers]:
        buffers = getattr(self, "_input_buffers", None) or []
        while len(buffers) < n_inputs:
            buffers.append(BatchBuffers())
        self._input_buffers = buffers
        return buffers

    def _named(self, result: Any) -> tuple[list[str], list[torch.Tensor]]:
        """Output names and tensors: a dict by its keys (in the signature's order when it names
        them all), a tuple/list or a tensor by position (the signature's names or output<k>)."""
        if isinstance(result, dict):
            names = [str(k) for k in result]
            wanted = [s.name for s in self.signature.outputs] if self.signature else []
            if wanted and set(wanted) == set(names):
                return wanted, [result[k] for k in wanted]
            return names, list(result.values())
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        return output_names(self.signature, len(results)), results

    # -- postprocess ----------------------------------------------------------------------------
    def postprocess(self, data: list[Any]) -> list[Any]:
        out = []
        for j, item in enumerate(data):
            if item is None:
                continue
            tensors, multi, names = item
            if self._is_v2(j):
                out.append({"outputs": self._v2_outputs(names, tensors)})
                continue
            single = self._single[j]
            values = [
                (t[0] if single else t).float().tolist()
                if t.is_floating_point()
                else (t[0] if single else t).tolist()
                for t in tensors
            ]
            out.append({"output": values if multi else values[0]})
        return out

    def _v2_outputs(self, names: list[str], tensors: list[torch.Tensor]) -> list[dict[str, Any]]:
        """Each output as OIP answers it, in the datatype the signature declares for its name."""
        declared = {s.name: s.datatype for s in self.signature.outputs} if self.signature else {}
        return [_v2_output(n, t, declared.get(n)) for n, t in zip(names, tensors, strict=True)]

    def _is_v2(self, j: int) -> bool:
        return self._v2_rows[self.kept_indices[j]]


def _host_tensor(array: np.ndarray, datatype: str, name: str | None) -> torch.Tensor:
    """A decoded host array as a tensor (widened where torch lacks the type's ops). A UINT64
    value past INT64's range in input ``name`` is a BadInput: the stand-in would wrap it
    (2**64 - 1 to -1); ``name`` None (a sequence control): its bits are kept."""
    big = datatype == "UINT64" and name is not None and array.size
    if big and int(array.max()) > np.iinfo(np.int64).max:
        raise BadInput(
            f"v2 input {name!r}: UINT64 value {int(array.max())} is past the INT64 range the "
            "model takes UINT64 in (torch has no uint64 arithmetic)"
        )
    if datatype in _WIDER:
        array = array.astype(_WIDER[datatype])
    tensor = _shared(array.view(np.int16) if datatype == "BF16" else array)
    return tensor.view(torch.bfloat16) if datatype == "BF16" else tensor


def _shared(array: np.ndarray) -> torch.Tensor:
    """``array`` as a tensor over the same memory. A read-only array is binary data read in place
    from the request's own body (a ``bytes`` object the worker received for this request alone
    and reads no further once decoded): the tensor uses it as it is. Any other read-only buffer
    is copied, so that the model never writes into memory the request does not own."""
    if array.flags.writeable:
        return torch.from_numpy(array)
    base: Any = array
    while isinstance(base, np.ndarray):
        base = base.base
    if not (isinstance(base, memoryview) and isinstance(base.obj, bytes)):
        return torch.from_numpy(array.copy())
    with warnings.catch_warnings():  # torch's warning that tensors cannot be read-only
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def _v2_output(name: str, tensor: torch.Tensor, declared: str | None) -> dict[str, Any]:
    """One OIP output as a numpy array (BF16 as its uint16 bits; no JSON conversion here), in
    the floating datatype the signature declares when the model returned another one."""
    t = tensor.detach().cpu()
    if declared in _FLOATING and t.is_floating_point() and t.dtype != _V2_DTYPES[declared]:
        t = t.to(_V2_DTYPES[declared])
    datatype = _V2_NAMES.get(t.dtype)
    if datatype is None:
        t, datatype = t.float(), "FP32"
    if datatype == "BF16":
        array = t.contiguous().view(torch.int16).numpy().view(np.uint16)
    else:
        array = t.numpy()
    return {"name": name, "datatype": datatype, "shape": list(array.shape), "array": array}
