"""Triton's sequence control inputs (handlers/runtime/controls.py) read the sequence's headers
under the names the server gave the worker's context (its ts_header_key_sequence_* keys)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from torchbay.handlers.runtime import controls

CONTROLS = [
    {"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}]},
    {"name": "END", "control": [{"kind": "CONTROL_SEQUENCE_END", "int32_false_true": [0, 1]}]},
    {
        "name": "CORRID",
        "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_UINT64"}],
    },
]
RENAMED = SimpleNamespace(
    header_key_sequence_id="Session-Id",
    header_key_sequence_start="session-start",
    header_key_sequence_end="session-end",
)


def _filled(headers: dict[str, str]) -> dict[str, object]:
    request = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    controls.fill(request, headers, CONTROLS, RENAMED)
    return {t["name"]: t["array"].tolist() for t in request["inputs"] if t.get("control")}


def test_controls_read_the_renamed_headers() -> None:
    """Was: the names were fixed to TorchServe's, so a server with renamed headers gave the
    model no control inputs at all."""
    filled = _filled({"session-id": "7", "session-start": "true"})
    assert filled == {"START": [[1]], "END": [[0]], "CORRID": [[7]]}
    assert _filled({"session-id": "7", "session-end": "true"})["END"] == [[1]]


def test_headers_under_torchserve_s_names_are_not_the_sequence_s() -> None:
    assert _filled({"ts_request_sequence_id": "7", "ts_request_sequence_start": "true"}) == {}


def test_the_default_names_are_torchserve_s() -> None:
    from torchbay.handlers.context import Context

    context = Context("m", "/nonexistent", {}, 1, None, "")
    filled: dict = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]}
    controls.fill(filled, {"ts_request_sequence_id": "9"}, CONTROLS, context)
    assert np.asarray(filled["inputs"][-1]["array"]).tolist() == [9]
