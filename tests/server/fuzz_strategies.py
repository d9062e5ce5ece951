"""Hypothesis strategies for requests to the three ports (see fuzzing.py for the checks).

Safe by construction: nothing generated can legitimately change the server's models or workers
(scale a loaded model to a valid count, unregister it, register a new one, rotate a key); such a
request would make the "worker pids unchanged" check meaningless. Invalid values for those routes
are generated freely: those must be refused.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from urllib.parse import quote

from hypothesis import strategies as st

from torchbay.server.config.settings import MAX_BATCH_SIZE, MAX_DELAY_MS, MAX_TIMEOUT_S

from .fuzzing import finite

MODELS = ("tiny", "probe")  # loaded, version 1.0 each
ODD_NAMES = [
    "",
    ".",
    "..",
    "%2e%2e",
    "%2E%2E%2F..",
    "%252e%252e",
    "..%2f..%2fetc",
    "a%2Fb",
    "%00",
    "%ff%fe",
    "nosuch",
    "TINY",
    "tiny.mar",
    "tiny%20",
    "%20",
    "ünïcødé",
    "模型",
    "x" * 300,
    "x" * 5000,
    "~",
    "tiny;v=1",
    "%0d%0aX-Injected:%201",
]
ODD_VERSIONS = ["1.0", "2.0", "all", "", "..", "%2e%2e", "1.0.0", "-1", "nan", "v" * 300, "%ff"]
NUMBERS = [
    "-1",
    "0",
    "1",
    "2",
    "-0",
    "1.5",
    "1e3",
    "1e309",
    "-1e309",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "Infinity",
    "9" * 40,
    "-" + "9" * 40,
    "0x10",
    " 1",
    "",
    "abc",
    "true",
    "%00",
    "%ff",
    "1_000",
]
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE"]
CONTENT_TYPES = [
    "application/json",
    "application/octet-stream",
    "text/plain",
    "multipart/form-data",
    "multipart/form-data; boundary=xyz",
    "application/x-www-form-urlencoded",
    "text/plain; charset=utf-99",
    "application/json; charset=latin-1",
    "",
    "*/*",
    "image/png",
]
DATATYPES = [
    "FP32",
    "FP16",
    "BF16",
    "FP64",
    "INT64",
    "INT32",
    "INT16",
    "INT8",
    "UINT8",
    "BOOL",
    "BYTES",
    "fp32",
    "",
    "FP128",
    5,
    None,
    ["FP32"],
    {"t": "FP32"},
    True,
]


def seg(text: str) -> str:
    return quote(text, safe="%~;:=")  # keep the odd names' own escapes


names = st.one_of(st.sampled_from(MODELS), st.sampled_from(ODD_NAMES), st.text(max_size=12))
versions = st.one_of(st.sampled_from(ODD_VERSIONS), st.text(max_size=8))
numbers = st.one_of(st.sampled_from(NUMBERS), st.integers().map(str), st.floats().map(str))


def qs(pairs: list[tuple[str, str]]) -> str:
    return "&".join(f"{quote(k, safe='[]')}={quote(v, safe='%')}" for k, v in pairs)


def query(keys: list[str]) -> st.SearchStrategy[str]:
    """Repeated, odd and missing values for these parameters (and a stray one)."""
    key = st.sampled_from([*keys, "x", "", "min_worker[]"])
    return st.lists(st.tuples(key, numbers), max_size=4).map(qs)


# -- bodies ---------------------------------------------------------------------------------------

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_leaf,
    lambda kids: (
        st.lists(kids, max_size=4)
        | st.dictionaries(
            st.text(max_size=8).filter(lambda k: k not in ("crash", "sleep")), kids, max_size=4
        )
    ),
    max_leaves=12,
)


def dumps(value: object) -> bytes:
    return json.dumps(value, allow_nan=True).encode()  # NaN/Infinity tokens on purpose


def deep(n: int, kind: str) -> bytes:
    if kind == "list":
        return b"[" * n + b"]" * n
    return b'{"a":' * n + b"1" + b"}" * n


bodies = st.one_of(
    st.binary(max_size=300),
    json_values.map(dumps),
    st.builds(deep, st.sampled_from([100, 5_000, 100_000]), st.sampled_from(["list", "dict"])),
    st.sampled_from([b"1e999", b"-1e999", b"9" * 5000, b"NaN", b"[NaN]", b"\xff\xfe{", b"{"]),
)

# -- Open Inference Protocol payloads -------------------------------------------------------------


@st.composite
def v2_payload(draw: Callable) -> tuple[bytes, str, str]:
    """(body, expect, note): a valid request for ``tiny`` (shape [n, 64], numbers) or one broken
    in one named way."""
    n = draw(st.integers(1, 3))
    tensor: dict[str, object] = {
        "name": "x",
        "shape": [n, 64],
        "datatype": draw(st.sampled_from(["FP32", "FP64", "FP16"])),
        "data": [draw(st.floats(-1e3, 1e3)) for _ in range(n * 64)],
    }
    payload: dict[str, object] = {"inputs": [tensor]}
    flaw = draw(
        st.sampled_from(
            [
                "none",
                "datatype",
                "shape",
                "length",
                "nested",
                "nan",
                "inf",
                "huge",
                "strings",
                "no_inputs",
                "inputs_type",
                "tensor_type",
                "missing",
                "outputs",
                "id",
                "bool_data",
            ]
        )
    )
    if flaw == "datatype":
        tensor["datatype"] = draw(st.sampled_from(DATATYPES[9:]))
    elif flaw == "shape":
        tensor["shape"] = draw(
            st.sampled_from(
                [
                    [],
                    [-1, 64],
                    [n, 65],
                    [10**12, 64],
                    ["2", 64],
                    None,
                    "2x64",
                    [n, -64],
                    [1.5, 64],
                    [[n], [64]],
                    [n, 64, 1, 1],
                    [0, 64],
                ]
            )
        )
    elif flaw == "length":
        tensor["data"] = tensor["data"][: draw(st.integers(0, n * 64 - 1))]  # type: ignore[index]
    elif flaw == "nested":
        tensor["data"] = [tensor["data"]]  # nested once: still n*64 numbers, a valid OIP form
        flaw = "none"
    elif flaw in ("nan", "inf"):
        tensor["data"][draw(st.integers(0, n * 64 - 1))] = float(flaw)  # type: ignore[index]
    elif flaw == "huge":
        tensor["data"][0] = 10 ** draw(st.integers(20, 400))  # type: ignore[index]
    elif flaw == "strings":
        tensor["data"][0] = draw(st.text(max_size=5))  # type: ignore[index]
    elif flaw == "no_inputs":
        payload["inputs"] = []
    elif flaw == "inputs_type":
        payload["inputs"] = draw(json_leaf)
    elif flaw == "tensor_type":
        payload["inputs"] = [draw(json_leaf)]
    elif flaw == "missing":
        del tensor[draw(st.sampled_from(["name", "shape", "datatype", "data"]))]
    elif flaw == "outputs":
        payload["outputs"] = draw(st.sampled_from([[{"name": "y"}], "y", [1], None, [{}]]))
        flaw = "output_y" if payload["outputs"] == [{"name": "y"}] else flaw
    elif flaw == "id":
        payload["id"] = draw(json_leaf)
        flaw = "none" if isinstance(payload["id"], str) else flaw
    elif flaw == "bool_data":
        tensor["datatype"], tensor["data"] = "BOOL", [True] * (n * 64)
        flaw = "bool"  # a BOOL input to a float model: refused (4xx) or converted, not a 5xx
    # NaN/Infinity tokens: refusing them or answering valid JSON are both fine; the response
    # checks catch a bare NaN in the answer.
    expect = {"none": "ok", "bool": "", "nan": "", "inf": "", "output_y": ""}.get(flaw, "4xx")
    return dumps(payload), expect, f"v2 {flaw}"


# -- headers --------------------------------------------------------------------------------------


def headers(keys: dict[str, str]) -> st.SearchStrategy[tuple[tuple[str, str], ...]]:
    """Content-Type and Authorization (good keys from ``keys``, bad ones, none) and a stray one."""
    good = [f"Bearer {k}" for k in keys.values()]
    auth = st.sampled_from(
        [
            *good,
            *good,
            "",
            "Bearer",
            "Bearer ",
            "Basic dXNlcjpwdw==",
            "bearer x",
            "Bearer \xe9",
            f"Bearer {'k' * 5000}",
            *(f"bearer  {k} " for k in keys.values()),
        ]
    )
    ctype = st.sampled_from(CONTENT_TYPES)
    stray = st.sampled_from(
        [
            ("X-Request-Id", "1"),
            ("Explain", "true"),
            ("Accept", "\xff"),
            ("Expect", "100-x"),
            ("Url_Path", "../x"),
            ("Transfer-Encoding", "gzip"),
        ]
    )
    return st.tuples(
        st.lists(ctype, max_size=1), st.lists(auth, max_size=1), st.lists(stray, max_size=1)
    ).map(
        lambda t: tuple(
            [("Content-Type", c) for c in t[0]] + [("Authorization", a) for a in t[1]] + t[2]
        )
    )


def with_auth(
    hs: tuple[tuple[str, str], ...], key: str | None, always: bool
) -> tuple[tuple[str, str], ...]:
    """``always``: replace any Authorization with the good ``key`` (auth-off runs ignore it)."""
    if not always or key is None:
        return hs
    return (*((k, v) for k, v in hs if k != "Authorization"), ("Authorization", f"Bearer {key}"))


# -- management parameters whose values must be refused on a loaded model --------------------------

LIMITS = {
    "batch_size": (1, MAX_BATCH_SIZE, True),
    "max_batch_delay": (0, MAX_DELAY_MS, False),
    "response_timeout": (0, MAX_TIMEOUT_S, False),
}


def out_of_bounds(key: str, value: str) -> bool:
    """A value config.py's bounds refuse (non-finite, negative, too large, not a number)."""
    low, high, integer = LIMITS[key]
    number = finite(value)
    if number is None or number > high or number < low:
        return True
    if key == "response_timeout" and number <= 0:
        return True
    return integer and not number.is_integer()


def bad_scale_value(value: str) -> bool:
    """A min_worker/max_worker value that cannot scale a loaded model to a real count."""
    number = finite(value)
    return number is None or number < 0 or not number.is_integer() or math.isinf(number)
