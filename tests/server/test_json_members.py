"""server/plane/json_members.py against json.loads, the parser it stands in for."""

from __future__ import annotations

import json
import math
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchbay.server.plane import json_members as jm
from torchbay.server.plane.schedule import schedule_of
from torchbay.server.plane.sequence_params import check_ignored, sequence_of
from torchbay.server.serving.protocol import WireRequest

NAMES = ("parameters", "inputs", "id")


def setup_module() -> None:
    """Walk every text here: below ``_SMALL`` bytes at_path leaves it to json.loads."""
    jm._SMALL = 0


def teardown_module() -> None:
    jm._SMALL = SMALL


SMALL = jm._SMALL
_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=20,
)
# Arrays of arrays (tensor data as clients nest it): the run takes two levels whole.
NESTED = st.lists(st.lists(st.lists(st.integers() | st.text(max_size=3), max_size=3)))
SPACES = st.sampled_from(["", " ", "\n", "\t ", "\r\n  "])


@st.composite
def documents(draw: st.DrawFn) -> bytes:
    """An object's text, written with odd spacing and repeated names (the last one counts)."""
    members = draw(
        st.lists(st.tuples(st.sampled_from(NAMES) | st.text(max_size=6), VALUES | NESTED))
    )
    pad = draw(SPACES)
    texts = [
        f"{pad}{json.dumps(k, ensure_ascii=draw(st.booleans()))}{pad}:{pad}{json.dumps(v)}{pad}"
        for k, v in members
    ]
    return f"{pad}{{{pad}{','.join(texts)}}}{pad}".encode()


def read(data: bytes, names: tuple[str, ...] = NAMES) -> dict[str, Any]:
    found = {n: jm.at_path(data, (n,)) for n in names}
    return {n: v for n, v in found.items() if v is not jm.MISSING}


def walk(value: Any, path: tuple[str | int, ...]) -> Any:
    """The oracle: ``path`` followed in what json.loads made."""
    for step in path:
        if isinstance(step, str):
            if not isinstance(value, dict) or step not in value:
                return jm.MISSING
        elif not isinstance(value, list) or step >= len(value):
            return jm.MISSING
        value = value[step]
    return value


@given(documents())
@settings(max_examples=150, deadline=None)
def test_reads_what_json_loads_reads(data: bytes) -> None:
    doc = json.loads(data)
    assert jm.members(data) is not None, "a valid object is followed to its end"
    assert read(data) == {n: doc[n] for n in NAMES if n in doc}


PATHS = st.lists(st.sampled_from(["inputs", "shape", "parameters"]) | st.integers(0, 2), max_size=4)


@given(documents(), st.sampled_from(NAMES), PATHS)
@settings(max_examples=150, deadline=None)
def test_a_path_leads_where_json_loads_leads(data: bytes, top: str, rest: list[Any]) -> None:
    path = (top, *rest)
    assert jm.at_path(data, path) == walk(json.loads(data), path)


@given(VALUES | NESTED, SPACES)
@settings(max_examples=100, deadline=None)
def test_a_value_ends_where_json_says(value: Any, pad: str) -> None:
    text = json.dumps(value).encode()
    assert jm.value_end(pad.encode() + text + b" ,", len(pad)) == len(pad) + len(text)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"{",
        b'{"parameters": {"priority": 1}',
        b'{"parameters": {"priority": 01}}',
        b'{"parameters": {"priority": 1}} x',
        b'{"parameters" {"priority": 1}}',
        b'{"inputs": [1, 2}',
        b'{"inputs": "abc}',
        b'{"a": 1,}',
        b"{'a': 1}",
        b'{"a": tru}',
        b'{"a": [1, 2]]}',
    ],
)
def test_no_json_raises_as_json_loads(data: bytes) -> None:
    with pytest.raises(ValueError) as expected:
        json.loads(data)
    with pytest.raises(type(expected.value)):
        read(data)


def test_malformed_text_inside_a_skipped_value_is_the_worker_s_400() -> None:
    """The walk does not read what it skips: the worker's whole parse answers the 400."""
    data = b'{"inputs": ["\\x", 01], "parameters": {"priority": 1}}'
    with pytest.raises(ValueError):
        json.loads(data)
    assert read(data, ("parameters",)) == {"parameters": {"priority": 1}}


@pytest.mark.parametrize(
    "data, names",
    [
        (b"[1, 2]", {}),
        (b'"parameters"', {}),
        (b"\xef\xbb\xbf" + b'{"id": "a"}', {"id": "a"}),  # a BOM: json.loads reads it whole
        ('{"id": "a"}'.encode("utf-16"), {"id": "a"}),
        (b'{"id": NaN, "parameters": {"timeout": -Infinity}}', "nan"),
        (b'{"param\\u0065ters": {"priority": 2}}', {"parameters": {"priority": 2}}),
    ],
)
def test_odd_but_json(data: bytes, names: Any) -> None:
    found = read(data)
    if names == "nan":
        assert found is not None and math.isnan(found["id"])
        assert found["parameters"] == {"timeout": -math.inf}
    else:
        assert found == names


def test_a_tensor_s_data_is_skipped_not_built() -> None:
    """The point of the module: the numbers of a 4 MB body are never made into objects
    (json.loads makes ~40 MB of them, and holds the GIL while it does)."""
    data = json.dumps(
        {
            "inputs": [{"name": "x", "shape": [500_000], "data": [1.5] * 500_000}],
            "rows": [[[i, i + 1], [i]] for i in range(50_000)],
            "parameters": {"priority": 1},
        }
    ).encode()
    tracemalloc.start()
    try:
        found = read(data, ("parameters",))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert found == {"parameters": {"priority": 1}}
    assert peak < len(data) // 10, peak


def test_the_first_input_s_batch_dimension() -> None:
    data = b'{"inputs" : [ {"data": [[1, 2]], "shape": [3, 2]}, {"shape": [9]} ]}'
    assert jm.at_path(data, ("inputs", 0, "shape", 0)) == 3
    assert jm.at_path(data, ("inputs", 1, "shape")) == [9]
    assert jm.at_path(data, ("inputs", 2, "shape")) is jm.MISSING
    assert jm.at_path(b'{"inputs": []}', ("inputs", 0)) is jm.MISSING
    assert jm.at_path(b'{"inputs": "a"}', ("inputs", 0)) is jm.MISSING
    assert jm.at_path(b'{"inputs": {"0": 1}}', ("inputs", 0)) is jm.MISSING


def _peak(read: Callable[[], Any]) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        found = read()
        return found, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_plane_reads_an_oip_body_s_parameters_without_its_tensors() -> None:
    """Priority, timeout and a sequence's parameters are read on the event loop before the
    request is queued: before, each reader made the whole body's objects (0.8 s for 4 MB of
    floats, with the GIL held: every other request waited)."""
    doc = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 400_000]}],
        "parameters": {"priority": 2, "timeout": 5000, "sequence_id": 7, "sequence_start": True},
    }
    doc["inputs"][0]["data"] = [0.5] * 400_000
    body = json.dumps(doc).encode()
    wire = WireRequest("1", body, "application/json", protocol="v2")
    bound = len(body) // 10  # json.loads made ~8x the body's size
    schedule, peak = _peak(lambda: schedule_of(wire))
    assert (schedule.priority, schedule.timeout_us, peak < bound) == (2, 5000, True), peak
    assert _peak(lambda: check_ignored(wire))[1] < bound
    (_, ref), peak = _peak(lambda: sequence_of(wire, batched=lambda: True))
    assert (ref.id, ref.start, peak < bound) == (7, True, True), peak
