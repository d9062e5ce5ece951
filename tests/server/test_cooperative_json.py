"""cooperative_json.loads against json.loads: the same value or the same error (type and
message) for generated documents and their mutations, read in windows small enough that every
path (runs of members, descended containers, strings in pieces, bytes decoded in parts) runs;
and the parse of a large body gives the loop turns along the way."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchbay.server.http import cooperative_json


@pytest.fixture
def small_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cooperative_json, "WINDOW", 48)
    monkeypatch.setattr(cooperative_json, "PROBE", 12)
    monkeypatch.setattr(cooperative_json, "BYTES", 7)


def _outcome(parse: Any, body: bytes, keep: int | None = None) -> tuple[Any, ...]:
    try:
        value = parse(body)
    except RecursionError:
        return ("RecursionError",)
    except (ValueError, UnicodeDecodeError) as exc:
        return (type(exc).__name__, str(exc))
    instances = value.get("instances") if isinstance(value, dict) else None
    if keep is not None and isinstance(instances, list):  # its first items, and how many
        total = getattr(instances, "total", len(instances))
        value = {**value, "instances": [total, instances[:keep]]}
    # NaN is not equal to itself: compare the text (a key's order is part of the answer)
    return ("value", json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))


def _same(body: bytes, keep: int | None = None) -> None:
    """``loads(body)`` is ``json.loads(body)``; with ``keep``, but for the instances past it,
    which are counted, not kept (and an error in them is still the error)."""
    expected = _outcome(json.loads, body, keep)
    kept = ("instances", keep) if keep is not None else None
    got = _outcome(lambda b: asyncio.run(cooperative_json.loads(b, kept)), body, keep)
    assert got == expected, body[:300]


CASES = [
    b"",
    b" \t\n\r ",
    b"[",
    b"{",
    b'{"instances": []}',
    b'{"instances": [[],[],[]], "instances": [1]}',  # the last of a key wins
    b'{"a": 1, "b": 2, "a": 3}',
    b' { "instances" :\n[ [ ] ,\t{ } , "x" , 1e3 , -0.5 , true , null ] } ',
    b'{"instances": [NaN, Infinity, -Infinity]}',
    b"\xef\xbb\xbf" + b'{"instances": [1]}',  # a UTF-8 BOM: json.loads strips it
    b"\xef\xbb\xbf" + b"[1,\xff]",  # its error's position counts from after the BOM
    b"\xef\xbb\xbf\xef\xbb\xbf[]",
    '{"instances": [1]}'.encode("utf-16"),
    '{"instances": [1]}'.encode("utf-32-le"),
    b'{"instances": ["\xe0\x80"]}',
    b'{"instances": ["\xed\xa0\x80"]}',  # an encoded surrogate: surrogatepass
    b'{"instances": [{"data": "\\ud800"}, "\\ud83d\\ude00", "\\ud83d", "\\u00e9"]}',
    b'{"instances": ["' + b"a" * 200 + b"\\ud83d\\ude00" + b"b" * 200 + b'"]}',
    b'{"instances": ["' + b"\\n" * 200 + b'"]}',  # escapes all along
    b'{"instances": ["' + b"x" * 300 + b'\x01"]}',
    b'{"instances": ["' + b"x" * 300,
    b'{"instances": ["' + b"x" * 300 + b"\\",
    b'{"instances": [1' + b"0" * 5000 + b"]}",  # past Python's digit limit
    b'{"instances": [' + b"[" * 100_000 + b"]}",
    b'{"instances": [' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_000 + b"]}",
    b'{"instances": [' + b"[" * 300 + b"1" + b"]" * 300 + b"]}",
    b'{"instances": [1, 2] ',
    b'{"instances": [1, 2]} x',
    b'{"instances": [1, 2,]}',
    b'{"instances": [1 2]}',
    b'{"instances" [1]}',
    b'{"instances": [1],}',
    b"{instances: [1]}",
    b'{"instances": [' + b",".join([b"[0,[0]]"] * 60) + b"]}",  # separators look alike
    b'{"instances": [' + b",".join([b'"a\\",b"'] * 60) + b"]}",
    b'{"instances": [' + b", ".join([b'{"data": [1, 2], "k": "v,w"}'] * 40) + b"]}",
    b'{"k": {' + b",".join(b'"%d": [%d]' % (i, i) for i in range(80)) + b"}}",
    b"[" + b" " * 500 + b"1" + b" " * 500 + b"]" + b" " * 500,
]


@pytest.mark.parametrize("body", CASES, ids=range(len(CASES)))
def test_cases_read_as_json_loads_reads_them(body: bytes, small_windows: None) -> None:
    _same(body)


@pytest.mark.parametrize("body", CASES, ids=range(len(CASES)))
def test_cases_with_the_real_windows(body: bytes) -> None:
    _same(body)


@pytest.mark.parametrize("body", CASES, ids=range(len(CASES)))
def test_cases_keeping_the_first_instances(body: bytes, small_windows: None) -> None:
    _same(body, keep=2)


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**30), 10**30)
    | st.floats(allow_nan=False)
    | st.sampled_from([math.inf, -math.inf])
    | st.text(st.characters(codec="utf-8") | st.sampled_from('\\",[]{}:\ud800 \n'), max_size=70)
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=12)
        | st.dictionaries(st.text(st.sampled_from('ab,"\\{'), max_size=3), inner, max_size=6)
    ),
    max_leaves=60,
)
_layouts = st.sampled_from(
    [
        {"separators": (",", ":")},
        {"separators": (", ", ": ")},
        {"separators": (" ,\r\n", " :\t")},
        {"indent": 1},
        {"indent": "\t", "ensure_ascii": False},
    ]
)


def _document(instances: list[Any], extra: dict[str, Any], layout: dict[str, Any]) -> bytes:
    text = json.dumps({**extra, "instances": instances}, **layout)
    return text.encode("utf-8", "surrogatepass")


_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_SETTINGS
@given(
    instances=st.lists(_values, min_size=1, max_size=30),
    extra=st.dictionaries(st.sampled_from(["instances", "x", "y"]), _values, max_size=2),
    layout=_layouts,
    keep=st.none() | st.integers(1, 4),
)
def test_generated_documents_read_as_json_loads_reads_them(
    instances: list[Any],
    extra: dict[str, Any],
    layout: dict[str, Any],
    keep: int | None,
    small_windows: None,
) -> None:
    _same(_document(instances, extra, layout), keep)


@_SETTINGS
@given(
    instances=st.lists(_values, min_size=1, max_size=20),
    layout=_layouts,
    keep=st.none() | st.integers(1, 4),
    data=st.data(),
)
def test_mutated_documents_fail_as_json_loads_fails(
    instances: list[Any],
    layout: dict[str, Any],
    keep: int | None,
    data: st.DataObject,
    small_windows: None,
) -> None:
    body = _document(instances, {}, layout)
    at = data.draw(st.integers(0, len(body)))
    byte = data.draw(st.sampled_from(list(b'[]{},:"\\ 0e.-\x01\xff\xc3\xe9')))
    kind = data.draw(st.sampled_from(["cut", "insert", "delete", "replace"]))
    mutated = {
        "cut": body[:at],
        "insert": body[:at] + bytes([byte]) + body[at:],
        "delete": body[:at] + body[at + 1 :],
        "replace": body[:at] + bytes([byte]) + body[at + 1 :],
    }[kind]
    _same(mutated, keep)


def test_a_large_body_is_read_in_many_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step gives the loop a turn (no time slice): a 6 MB body of two million instances
    takes hundreds of turns (json.loads: none), and the same instances come out."""
    monkeypatch.setattr(cooperative_json, "SLICE_S", 0.0)
    body = b'{"instances": [' + b",".join([b"[]"] * 2_000_000) + b"]}"

    async def parse() -> tuple[Any, int]:
        turns = 0
        done = False

        async def count() -> None:
            nonlocal turns
            while not done:
                await asyncio.sleep(0)
                turns += 1

        counter = asyncio.ensure_future(count())
        await asyncio.sleep(0)
        value = await cooperative_json.loads(body)
        done = True
        await counter
        return value, turns

    value, turns = asyncio.run(parse())
    assert value == {"instances": [[]] * 2_000_000}
    assert turns > len(body) // cooperative_json.WINDOW // 2


def test_a_long_container_deep_in_the_body_is_read_in_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A long array 20 containers deep gives the loop as many turns as one at the top: the
    containers being read are a stack of their own. Past 8 levels each container was one
    scanner call: 6 turns for this 1.2 MB body, as if json.loads had held the loop."""
    monkeypatch.setattr(cooperative_json, "SLICE_S", 0.0)
    body = b'{"instances": ' + b"[" * 20 + b",".join([b"[]"] * 200_000) + b"]" * 20 + b"}"
    turns: list[int] = []

    async def parse() -> Any:
        async def count() -> None:
            while True:
                await asyncio.sleep(0)
                turns.append(1)

        counter = asyncio.ensure_future(count())
        await asyncio.sleep(0)
        try:
            return await cooperative_json.loads(body)
        finally:
            counter.cancel()

    assert asyncio.run(parse()) == json.loads(body)
    assert len(turns) > len(body) // cooperative_json.WINDOW // 2


def test_nesting_past_the_recursion_limit_is_a_recursion_error() -> None:
    """As json.loads: nesting deeper than the interpreter allows is a RecursionError (read
    without a Python frame per level, it is counted)."""
    deep = b"[" * (sys.getrecursionlimit() + 1) + b"]" * (sys.getrecursionlimit() + 1)
    with pytest.raises(RecursionError):
        json.loads(deep)
    with pytest.raises(RecursionError):
        asyncio.run(cooperative_json.loads(deep))
    shallow = b"[" * 500 + b"1" + b"]" * 500
    assert asyncio.run(cooperative_json.loads(shallow)) == json.loads(shallow)


def test_instances_past_keep_are_counted_not_kept() -> None:
    body = b'{"instances": [' + b",".join([b"[]"] * 100_000) + b'], "x": 1}'
    value = asyncio.run(cooperative_json.loads(body, ("instances", 3)))
    assert value == {"instances": [[], [], []], "x": 1}
    assert value["instances"].total == 100_000
