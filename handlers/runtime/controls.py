"""Triton's sequence control inputs, filled by the server (the worker side of sequences).

A sequence model may declare, in model-config.yaml, the control inputs of Triton's
``sequence_batching`` (model_config.proto's form)::

    sequence_batching:
      control_input:
        - name: START
          control: [{kind: CONTROL_SEQUENCE_START, int32_false_true: [0, 1]}]
        - name: CORRID
          control: [{kind: CONTROL_SEQUENCE_CORRID, data_type: TYPE_UINT64}]

Each OIP request of a sequence then gets those tensors, one value per batch row, from the
sequence headers the frontend set (server/plane/sequence_params.py; under the names of the
context's ``header_key_sequence_*``, the server's ``ts_header_key_sequence_*`` keys): START and
END from the request's flags, READY always true (the request is ready to run), CORRID the
sequence's id.
A request that names a control input itself is refused: the server fills it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import BadInput

_FLAGS = {  # Triton's ``*_false_true`` pairs: datatype, numpy type
    "int32_false_true": ("INT32", np.int32),
    "fp32_false_true": ("FP32", np.float32),
    "bool_false_true": ("BOOL", np.bool_),
}
_CORRID = {  # CORRID's integer types
    "TYPE_UINT64": ("UINT64", np.uint64),
    "TYPE_INT64": ("INT64", np.int64),
    "TYPE_UINT32": ("UINT32", np.uint32),
    "TYPE_INT32": ("INT32", np.int32),
}


def declared(yaml_config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The control inputs a model-config.yaml declares ([] for none)."""
    batching = yaml_config.get("sequence_batching")
    if not isinstance(batching, Mapping):
        return []
    controls = batching.get("control_input")
    return [c for c in controls if isinstance(c, Mapping)] if isinstance(controls, list) else []


def fill(
    request: dict[str, Any], headers: Mapping[str, str], controls: list[dict], context: Any
) -> None:
    """Append each declared control input to a parsed OIP ``request`` (see the docstring);
    ``headers``: the request's (lower-case names), the sequence's under ``context``'s
    ``header_key_sequence_*`` names (the server's)."""
    if not controls:
        return
    flags = {
        key: headers.get(str(getattr(context, f"header_key_sequence_{key}")).lower())
        for key in ("id", "start", "end")
    }
    if flags["id"] is None:
        return
    named = {t.get("name") for t in request["inputs"]}
    first = request["inputs"][0] if request["inputs"] else None
    rows = int(first["shape"][0]) if first is not None and len(first["shape"]) > 1 else None
    for control in controls:
        name = str(control.get("name"))
        if name in named:
            raise BadInput(f"input {name!r} is a sequence control input: the server sets it")
        for kind in control.get("control") or ():
            datatype, value = _value(kind, flags)
            shape = [rows, 1] if rows is not None else [1]
            array = np.full(shape, value[1], dtype=value[0])
            # (control: a UINT64 CORRID past INT64 reaches the tensor handler's INT64 stand-in
            # with its bits kept, an id as good as any, not refused as a client's value is)
            request["inputs"].append(
                {
                    "name": name,
                    "datatype": datatype,
                    "shape": shape,
                    "array": array,
                    "control": True,
                }
            )


def _value(kind: Mapping[str, Any], flags: Mapping[str, Any]) -> tuple[str, tuple[Any, Any]]:
    """(datatype, (numpy type, value)) of one control; ``flags``: the sequence's id, start and
    end headers' values (None: absent)."""
    what = kind.get("kind")
    if what == "CONTROL_SEQUENCE_CORRID":
        sequence_id = flags["id"]
        if kind.get("data_type") == "TYPE_STRING":
            return "BYTES", (object, sequence_id.encode())
        datatype, np_type = _CORRID.get(kind.get("data_type"), ("UINT64", np.uint64))
        return datatype, (np_type, _corrid(sequence_id, datatype, np_type))
    on = {
        "CONTROL_SEQUENCE_START": flags["start"] == "true",
        "CONTROL_SEQUENCE_END": flags["end"] == "true",
        "CONTROL_SEQUENCE_READY": True,
    }.get(str(what))
    if on is None:
        raise BadInput(f"unknown sequence control kind {what!r}")
    for key, (datatype, np_type) in _FLAGS.items():
        if key in kind:
            pair = kind[key]
            return datatype, (np_type, pair[1] if on else pair[0])
    return "INT32", (np.int32, int(on))


def _corrid(sequence_id: str, datatype: str, np_type: Any) -> int:
    """The sequence id as CORRID's integer; BadInput (400) for one that is not an integer or
    that the declared type cannot hold (numpy's OverflowError would read as a 413)."""
    digits = sequence_id.removeprefix("-")
    if not (digits.isascii() and digits.isdigit()):
        raise BadInput(f"sequence id {sequence_id!r} is not an integer (CORRID)")
    value, info = int(sequence_id), np.iinfo(np_type)
    if not info.min <= value <= info.max:
        raise BadInput(f"sequence id {sequence_id} does not fit CORRID's type {datatype}")
    return value
