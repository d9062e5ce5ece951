"""Fuzz every route of the three ports of a live server against its own OpenAPI documents.

Every response must have a status its route documents (or a generic one of its port), no 5xx but
503/504, no traceback or filesystem path in its body, JSON that parses (no bare NaN), the error
shape of its API; invalid input must get a 4xx and valid input a 200. Afterwards the server is
healthy, ready, and runs the same worker processes (nothing a client sent killed one).

The server: ``tiny`` (tensor handler) and ``probe`` loaded, ``enable_model_api``; token auth off
for most tests and on for one. Hypothesis runs derandomized with a bounded number of examples;
``TORCHBAY_FUZZ_EXAMPLES=N`` sets every test's count, and enables ``test_fuzz_long`` (marker
``fuzz_long``, skipped without the variable): ``TORCHBAY_FUZZ_EXAMPLES=2000 pytest -m fuzz_long``.
A quick run: ``TORCHBAY_FUZZ_EXAMPLES=20 pytest tests/server/test_fuzz.py`` (every documented
operation is still swept once per port). Findings are collected (one example per distinct
problem, with a repro line) and reported together at the end of each test.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from . import fuzz_strategies as fs
from .conftest import LiveServer, make_config
from .fuzzing import Findings, Req, Resp, operation, problems, send

EXAMPLES = int(os.environ.get("TORCHBAY_FUZZ_EXAMPLES", "0") or 0)
# A long run gets time for its examples (about 0.5 s a request on a loaded 2-core machine).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(max(120, EXAMPLES * 3 // 2 + 60))]


def examples(default: int) -> int:
    return EXAMPLES or default


def fuzz_settings(n: int) -> settings:
    return settings(
        max_examples=n,
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],  # findings are collected, not shrunk
        suppress_health_check=list(HealthCheck),
    )


# -- the servers --------------------------------------------------------------------------------


def _server(store: Path, **overrides: Any) -> Iterator[LiveServer]:
    config = make_config(
        store, load_models=["tiny=tiny.mar", "probe=probe.mar"], enable_model_api=True, **overrides
    )
    server = LiveServer(config).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def open_server(model_store: Path) -> Iterator[LiveServer]:
    yield from _server(model_store)


@pytest.fixture(scope="module")
def auth_server(model_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    keys = tmp_path_factory.mktemp("keys") / "key_file.json"
    yield from _server(model_store, disable_token_authorization=False, key_file=keys)


class Fuzzer:
    """Sends requests to one live server, checks each response, collects the findings."""

    def __init__(self, server: LiveServer) -> None:
        self.server = server
        state = server.server.state.ports
        self.ports = {
            "inference": state.inference,
            "management": state.management,
            "metrics": state.metrics,
        }
        self.auth = server.server.auth
        self.docs = {port: self._document(port) for port in self.ports}
        self.findings = Findings()
        self.hit: set[tuple[str, str, str]] = set()  # (port, method, documented path)
        self._wait_ready()
        self.pids = sorted(server.worker_pids())
        self.baseline = {m: self._settings(m) for m in fs.MODELS}

    def _wait_ready(self, deadline_s: float = 90.0) -> None:
        """A worker an earlier test killed may still be restarting: wait for all (bounded)."""
        end = time.monotonic() + deadline_s
        while self._get("inference", "/v2/health/ready", "inference").status_code != 200:
            if time.monotonic() > end:
                return  # assert_clean reports it
            time.sleep(0.2)

    def _get(self, port: str, path: str, kind: str | None = None) -> httpx.Response:
        headers = {}
        if self.auth is not None and kind is not None:
            headers["Authorization"] = f"Bearer {self.auth.keys[kind].value}"
        url = f"http://127.0.0.1:{self.ports[port]}{path}"
        return httpx.get(url, headers=headers, timeout=60)

    def _document(self, port: str) -> dict[str, Any]:
        r = self._get(port, "/openapi.json")
        assert r.status_code == 200, (port, r.text)
        return r.json()

    def _settings(self, model: str) -> dict[str, Any]:
        r = self._get("management", f"/models/{model}", "management")
        assert r.status_code == 200, r.text
        d = r.json()[0]
        return {
            "batch_size": d["batchSize"],
            "max_batch_delay": d["maxBatchDelay"],
            "response_timeout": d["responseTimeout"],
        }

    def keys(self) -> dict[str, str]:
        return {} if self.auth is None else {k: v.value for k, v in self.auth.keys.items()}

    def authorized(self, req: Req) -> bool:
        if self.auth is None:
            return True
        kind = "inference" if req.port == "inference" else "management"
        for name, value in req.headers:
            if name.lower() == "authorization":
                scheme, _, token = value.strip().partition(" ")
                return scheme.lower() == "bearer" and token.strip() == self.auth.keys[kind].value
        return False

    def check(self, req: Req) -> None:
        matched = operation(self.docs[req.port], req)
        if matched is not None:
            self.hit.add((req.port, req.method.lower(), matched[0]))
        resp = send("127.0.0.1", self.ports[req.port], req)
        found = problems(self.docs[req.port], req, resp, authorized=self.authorized(req))
        found.extend(self._scale_oracle(req, resp))
        self.findings.add(self.docs[req.port], req, resp, found)

    def _scale_oracle(self, req: Req, resp: Resp) -> list[str]:
        """A tuning value config.py refuses must be refused by the scale route too; anything
        accepted on a loaded model is put back before the next request."""
        model = _scaled_model(req)
        if model is None or not 200 <= resp.status < 300:
            return []
        self._restore(model)
        params = dict(parse_qsl(req.query, keep_blank_values=True))  # the last value wins
        bad = [f"{k}={v}" for k, v in params.items() if k in fs.LIMITS and fs.out_of_bounds(k, v)]
        return [f"scale accepted out-of-bounds {', '.join(bad)}"] if bad else []

    def _restore(self, model: str) -> None:
        query = "&".join(f"{k}={v}" for k, v in self.baseline[model].items())
        headers = {}
        if self.auth is not None:
            headers["Authorization"] = f"Bearer {self.auth.keys['management'].value}"
        url = f"http://127.0.0.1:{self.ports['management']}/models/{model}?{query}&synchronous=true"
        r = httpx.put(url, headers=headers, timeout=60)
        assert r.status_code == 200, f"could not restore {model}'s settings: {r.text}"

    def assert_clean(self) -> None:
        """No finding, and the server healthy with the same workers."""
        health = [
            ("inference", "/ping", "inference", {"status": "Healthy"}),
            ("inference", "/v2/health/ready", "inference", {"ready": True}),
            *(
                ("inference", f"/v2/models/{m}/ready", "inference", {"name": m, "ready": True})
                for m in fs.MODELS
            ),
        ]
        broken = [
            f"{path}: {r.status_code} {r.text[:200]}"
            for port, path, kind, want in health
            if (r := self._get(port, path, kind)).status_code != 200 or r.json() != want
        ]
        pids = sorted(self.server.worker_pids())
        if pids != self.pids:
            broken.append(f"worker pids changed: {self.pids} -> {pids} (a worker died)")
        for m in fs.MODELS:
            if self._settings(m) != self.baseline[m]:
                broken.append(f"{m}'s settings changed: {self._settings(m)}")
        if broken or self.findings.seen:
            report = self.findings.report() if self.findings.seen else ""
            lines = "\n".join(broken)
            pytest.fail(f"after {self.findings.count} requests:\n{lines}\n{report}", False)


def _scaled_model(req: Req) -> str | None:
    if req.port != "management" or req.method != "PUT" or req.path.endswith("/set-default"):
        return None
    parts = unquote(req.path).split("/")
    if len(parts) in (3, 4) and parts[1] == "models" and parts[2] in fs.MODELS:
        return parts[2]
    return None


# -- request strategies -------------------------------------------------------------------------


def _path(*segments: str | None) -> str:
    return "/" + "/".join(fs.seg(s) for s in segments if s is not None)


def _stray(hs: tuple[tuple[str, str], ...]) -> bool:
    return any(k not in ("Content-Type", "Authorization") for k, _ in hs)


# The kinds of request each port's strategy draws from; a kind named twice is drawn twice as often.
_INFERENCE_KINDS = [
    "predict",
    "predict",
    "explain",
    "infer",
    "infer",
    "infer",
    "get",
    "fixed",
    "kserve",
    "random",
]
_MANAGEMENT_KINDS = [
    "list",
    "describe",
    "v1",
    "scale",
    "scale",
    "default",
    "delete",
    "register",
    "register",
    "token",
    "describe_api",
    "random",
]


def _headers_and_kind(
    draw: Callable, keys: dict[str, str], port: str, authed: bool, kinds: list[str]
) -> tuple[tuple[tuple[str, str], ...], str]:
    """Headers (with the port's key on 7 draws in 10 when ``authed``) and a kind of request."""
    hs = draw(fs.headers(keys))
    hs = fs.with_auth(hs, keys.get(port), authed and draw(st.integers(0, 9)) < 7)
    return hs, draw(st.sampled_from(kinds))


@st.composite
def inference_requests(draw: Callable, keys: dict[str, str], authed: bool) -> Req:
    hs, kind = _headers_and_kind(draw, keys, "inference", authed, _INFERENCE_KINDS)
    name = draw(fs.names)
    version = draw(st.none() | fs.versions)
    body, expect, note = draw(fs.bodies), "", ""
    if kind in ("predict", "explain"):
        extra = draw(st.none() | st.sampled_from(["x", "a/b", "..", "%2e%2e/x"]))
        base = "predictions" if kind == "predict" else "explanations"
        path = _path(base, name, version if version or extra is None else "1.0")
        path += f"/{extra}" if extra else ""
        method = draw(st.sampled_from(["POST", "PUT"])) if kind == "predict" else "POST"
        if name == "tiny" and draw(st.booleans()):
            rows = draw(st.integers(0, 3))
            cut = draw(st.sampled_from([0, 0, 1, 3]))
            body = b"\0" * (256 * rows - cut) if rows else b""
            octet = ("Content-Type", "application/octet-stream")
            hs = (*((k, v) for k, v in hs if k != "Content-Type"), octet)
            # tiny.mar declares no input_shape: one row (64 floats) is a sample; more rows read
            # as one longer sample the model refuses (422)
            ok = kind == "predict" and rows == 1 and cut == 0 and version in (None, "1.0")
            expect, note = ("ok" if ok else "4xx" if rows != 1 or cut else ""), "tensor bytes"
        elif name == "probe" and draw(st.booleans()):
            body = fs.dumps(
                draw(
                    st.dictionaries(st.sampled_from(["echo", "bad", "x"]), fs.json_leaf, max_size=3)
                )
            )
    elif kind == "infer":
        path = _path("v2", "models", name, *(["versions", version] if version else []), "infer")
        method = draw(st.sampled_from(["POST", "POST", "POST", "GET", "PUT"]))
        if draw(st.integers(0, 3)) > 0:
            body, expect, note = draw(fs.v2_payload())
            if name != "tiny" or version not in (None, "1.0") or method != "POST":
                expect = ""
    elif kind == "get":
        tail = draw(st.sampled_from([[], ["ready"], ["ready", "x"], ["versions"]]))
        path = _path("v2", "models", name, *(["versions", version] if version else []), *tail)
        method = draw(st.sampled_from(["GET", "GET", "HEAD", "DELETE", "POST"]))
    elif kind == "kserve":
        verb = draw(st.sampled_from([":predict", ":predict", ":explain", "", ":"]))
        path, method = _path("v1", "models", name) + verb, draw(st.sampled_from(["POST", "GET"]))
        if draw(st.booleans()):
            instances = draw(st.lists(fs.json_values, max_size=3))
            body = fs.dumps(draw(st.sampled_from([{"instances": instances}, instances])))
    elif kind == "fixed":
        path = draw(
            st.sampled_from(
                [
                    "/ping",
                    "/v2",
                    "/v2/",
                    "/v2/health/live",
                    "/v2/health/ready",
                    "/",
                    "/openapi.json",
                    "/api-description",
                    "/v2/health/x",
                ]
            )
        )
        method = draw(st.sampled_from(["GET", "OPTIONS", "POST"]))
    else:
        path = draw(st.sampled_from(["", "/", "//", "/v2//models", "/predictions", "/%2e%2e/ping"]))
        path = path + fs.seg(draw(st.text(max_size=10)))
        path = path if path.startswith("/") else "/" + path
        method = draw(st.sampled_from(fs.METHODS))
    query = draw(fs.query(["explain", "data"])) if draw(st.integers(0, 4)) == 0 else ""
    if _stray(hs) or query:
        expect = ""  # an explain header or parameter, a bad Transfer-Encoding...
    return Req("inference", method, path, query, hs, body, expect, note)


_SCALE_KEYS = ["min_worker", "max_worker", "synchronous", "timeout", *fs.LIMITS]
_REGISTER_KEYS = [
    "handler",
    "runtime",
    "batch_size",
    "max_batch_delay",
    "initial_workers",
    "synchronous",
    "response_timeout",
    "startup_timeout",
]
_URLS = [
    "",
    "nosuch.mar",
    "../tiny.mar",
    "%2e%2e/x.mar",
    "/etc/passwd",
    "file:///etc/passwd",
    "http://127.0.0.1:1/x.mar",
    "https://example.invalid/x.mar",
    "tiny.mar",
    "probe.mar",
    "x" * 3000,
    "\0.mar",
    "tiny",
]


@st.composite
def scale_query(draw: Callable, real: bool) -> str:
    """On a loaded model only values that cannot change its workers: min_worker 1 or invalid."""
    pairs = draw(st.lists(st.tuples(st.sampled_from(_SCALE_KEYS), fs.numbers), max_size=4))
    if real:
        pairs = [
            (k, v)
            for k, v in pairs
            if k != "min_worker" or fs.bad_scale_value(v) or fs.finite(v) == 1
        ]
    return fs.qs(pairs)


@st.composite
def register_params(draw: Callable) -> list[tuple[str, str]]:
    url = draw(st.sampled_from(_URLS) | st.text(max_size=12))
    pairs = [("url", url)] if draw(st.integers(0, 5)) else []
    name = draw(st.none() | st.sampled_from(["tiny", "probe", "", "../x", "a b", "-x", "ok_name"]))
    if url in ("tiny.mar", "probe.mar", "tiny") and name == "ok_name":
        name = None  # would register a new model
    if name is not None:
        pairs.append(("model_name", name))
    pairs += draw(st.lists(st.tuples(st.sampled_from(_REGISTER_KEYS), fs.numbers), max_size=3))
    return pairs


@st.composite
def management_requests(draw: Callable, keys: dict[str, str], authed: bool) -> Req:
    hs, kind = _headers_and_kind(draw, keys, "management", authed, _MANAGEMENT_KINDS)
    name = draw(fs.names)
    real = name in fs.MODELS
    version = draw(st.none() | fs.versions)
    body, query, method = b"", "", "GET"
    if kind == "list":
        path, query = "/models", draw(fs.query(["limit", "next_page_token"]))
    elif kind == "describe":
        path = _path("models", name, version)
    elif kind == "v1":
        path = _path("v1", "models", name)
    elif kind == "scale":
        method, path = "PUT", _path("models", name, version)
        query = draw(scale_query(real))
    elif kind == "default":
        method, path = "PUT", _path("models", name, version or "1.0", "set-default")
    elif kind == "delete":
        if real and (version is None or unquote(fs.seg(version)) == "1.0"):
            version = "9.9"  # never unregister a loaded model
        method, path = "DELETE", _path("models", name, version)
    elif kind == "register":
        method, path = "POST", "/models"
        pairs = draw(register_params())
        if draw(st.booleans()):
            query = fs.qs(pairs)
        else:
            body = fs.dumps(dict(pairs)) if draw(st.integers(0, 3)) else draw(fs.bodies)
            hs = (*hs, ("Content-Type", "application/json"))
    elif kind == "token":
        kind_value = draw(st.none() | st.sampled_from(["management", "inference", "API", "", "x"]))
        path, query = "/token", "" if kind_value is None else f"type={quote(kind_value)}"
        if kind_value in (None, "management", "inference"):  # never rotate a key
            hs = tuple((k, v) for k, v in hs if keys.get("API", "\0") not in v)
    elif kind == "describe_api":
        method, path = draw(
            st.sampled_from(
                [
                    ("OPTIONS", "/"),
                    ("GET", "/openapi.json"),
                    ("GET", "/"),
                    ("OPTIONS", "/openapi.json"),
                ]
            )
        )
    else:
        method = draw(st.sampled_from([m for m in fs.METHODS if m not in ("PUT", "DELETE")]))
        path = _path("models", name, version) if draw(st.booleans()) else _path(name)
        body = draw(fs.bodies)
    return Req("management", method, path, query, hs, body)


@st.composite
def metrics_requests(draw: Callable, keys: dict[str, str], authed: bool) -> Req:
    hs = draw(fs.headers(keys))
    kind = draw(st.sampled_from(["metrics", "metrics", "describe", "random"]))
    method, query = "GET", ""
    if kind == "metrics":
        path = "/metrics"
        method = draw(st.sampled_from(["GET", "GET", "HEAD", "POST"]))
        names = st.sampled_from(["ts_inference_requests_total", "", "%ff", "x" * 500])
        query = fs.qs(
            [("name[]", n) for n in draw(st.lists(names | st.text(max_size=8), max_size=3))]
        )
        if draw(st.booleans()):
            query += "&name[]=%ff%fe"
    elif kind == "describe":
        path = draw(st.sampled_from(["/", "/openapi.json"]))
        method = draw(st.sampled_from(["GET", "OPTIONS", "DELETE"]))
    else:
        path = _path(draw(fs.names))
        method = draw(st.sampled_from(fs.METHODS))
    return Req("metrics", method, path, query, hs, draw(fs.bodies) if method == "POST" else b"")


STRATEGIES = {
    "inference": inference_requests,
    "management": management_requests,
    "metrics": metrics_requests,
}


def sweep(fuzzer: Fuzzer, port: str) -> None:
    """Every operation of the port's document, with loaded and unknown models and versions,
    an empty and a JSON body: each route is reached whatever Hypothesis draws."""
    keys = fuzzer.keys()
    kind = "inference" if port == "inference" else "management"
    auth = (("Authorization", f"Bearer {keys[kind]}"),) if kind in keys else ()
    for path, item in fuzzer.docs[port]["paths"].items():
        for method in item:
            if method not in ("get", "head", "put", "post", "delete", "options", "patch"):
                continue
            for name, version in (("tiny", "1.0"), ("probe", "9.9"), ("%2e%2e", "..")):
                if method == "delete" and (name in fs.MODELS and version == "1.0"):
                    continue  # never unregister a loaded model
                if method == "delete" and "{version}" not in path and name in fs.MODELS:
                    continue
                if path.endswith("/unload") and name in fs.MODELS:
                    continue  # never unload a loaded model (Triton's repository extension)
                filled = (
                    path.replace("{model_name}", name)
                    .replace("{name}", name)
                    .replace("{model_version}", version)
                    .replace("{version}", version)
                )
                for body in (b"", b"{}"):
                    ct = (("Content-Type", "application/json"),) if body else ()
                    fuzzer.check(Req(port, method.upper(), filled, "", auth + ct, body))


def fuzz(fuzzer: Fuzzer, port: str, n: int, *, authed: bool = False) -> None:
    sweep(fuzzer, port)
    strategy = STRATEGIES[port](fuzzer.keys(), authed)

    @fuzz_settings(n)
    @given(req=strategy)
    def one(req: Req) -> None:
        fuzzer.check(req)

    one()


# -- the tests ------------------------------------------------------------------------------------


def test_known_hard_inputs(open_server):
    """A fixed corpus of inputs that broke servers like this one, on every port."""
    fuzzer = Fuzzer(open_server)
    for req in corpus():
        fuzzer.check(req)
    fuzzer.assert_clean()


@pytest.mark.parametrize(("port", "n"), [("inference", 150), ("management", 150), ("metrics", 40)])
def test_fuzz_port(open_server, port, n):
    fuzzer = Fuzzer(open_server)
    fuzz(fuzzer, port, examples(n))
    documented = {
        (port, method, path)
        for path, item in fuzzer.docs[port]["paths"].items()
        for method in item
        if method in ("get", "head", "put", "post", "delete", "options", "patch")
    }
    assert documented <= fuzzer.hit, f"never sent: {sorted(documented - fuzzer.hit)}"
    fuzzer.assert_clean()


def test_fuzz_with_token_auth(auth_server):
    """Token auth on: most requests carry the right key, the others none or a bad one."""
    fuzzer = Fuzzer(auth_server)
    for port, n in (("inference", 60), ("management", 60), ("metrics", 10)):
        fuzz(fuzzer, port, examples(n), authed=True)
    fuzzer.assert_clean()


@pytest.mark.fuzz_long
@pytest.mark.skipif(not EXAMPLES, reason="set TORCHBAY_FUZZ_EXAMPLES=N for the long fuzz run")
def test_fuzz_long(open_server):
    """Every port, N examples each: a long run for nightly or before a release."""
    fuzzer = Fuzzer(open_server)
    for port in STRATEGIES:
        fuzz(fuzzer, port, EXAMPLES)
    fuzzer.assert_clean()


_REGISTER_URLS = ("../../../etc/passwd", "%2e%2e/%2e%2e/x.mar", "/etc/passwd", "tiny.mar")
_REGISTER_URLS += ("x" * 3000, "https://example.invalid/x.mar")


def corpus() -> list[Req]:
    json_ct = (("Content-Type", "application/json"),)

    def v2(tensor: dict[str, Any], note: str, expect: str = "4xx") -> Req:
        body = fs.dumps({"inputs": [{"name": "x", **tensor}]})
        return Req("inference", "POST", "/v2/models/tiny/infer", "", json_ct, body, expect, note)

    good = {"shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}
    reqs = [
        Req("inference", "POST", "/predictions/probe", "", json_ct, fs.deep(100_000, "list")),
        Req("inference", "POST", "/predictions/probe", "", json_ct, fs.deep(100_000, "dict")),
        Req("inference", "POST", "/predictions/tiny", "", json_ct, fs.deep(100_000, "list")),
        Req("inference", "POST", "/v2/models/tiny/infer", "", json_ct, fs.deep(100_000, "dict")),
        Req("inference", "POST", "/predictions/probe", "", json_ct, b"9" * 5000),
        Req("inference", "POST", "/predictions/probe", "", json_ct, b'{"echo": 1e999}'),
        Req("inference", "POST", "/predictions/tiny", "", (), b"\xff" * 256),  # NaN float32s
        Req("inference", "POST", "/explanations/tiny", "", (), b"\0" * 256),
        Req("inference", "POST", "/predictions/tiny", "", (("Content-Length", "9" * 12),), b"x"),
        Req("inference", "POST", "/predictions/tiny/1.0/%E6%A8%A1", "", (), b"\0" * 256),
        v2(good, "valid", "ok"),
        *(v2({**good, "datatype": d}, f"datatype {d!r}") for d in fs.DATATYPES[9:]),
        v2({**good, "shape": [-1, 64]}, "negative dimension"),
        v2({**good, "shape": [1, 64, 1, 1]}, "4-d input to a 2-d model"),
        v2({**good, "shape": [1, 32], "data": [0.5] * 32}, "wrong feature count"),
        v2({**good, "data": [0.5] * 63}, "data shorter than shape"),
        v2({**good, "data": [[0.5] * 64, [1]]}, "ragged nested data"),
        v2({**good, "data": [float("nan")] * 64}, "NaN data", ""),
        v2({**good, "data": [10**400] * 64}, "number beyond float64"),
        v2({**good, "data": ["a"] * 64}, "strings as FP32"),
        v2({**good, "shape": [10**12, 64]}, "huge shape"),
    ]
    for key, values in {
        "batch_size": ["0", "nan", "1e9", "99999999999999999999"],
        "max_batch_delay": ["-1", "nan", "inf", "1e400", "1e30"],
        "response_timeout": ["0", "nan", "inf", "1e30"],
        "min_worker": ["-1", "nan", "1.5"],
    }.items():
        reqs += [Req("management", "PUT", "/models/tiny", f"{key}={v}") for v in values]
    reqs += [
        Req("management", "GET", "/models", q)
        for q in ("limit=1e309", "limit=-1", "next_page_token=" + "9" * 40, "limit=nan")
    ]
    reqs += [
        Req("management", "POST", "/models", f"url={quote(u, safe='')}") for u in _REGISTER_URLS
    ]
    reqs += [
        Req("management", "POST", "/models", "", json_ct, fs.deep(100_000, "dict")),
        # One trailing slash is the same path (TorchServe's, and its Postman collection's
        # `DELETE /models/m/`): an unknown model's, and a describe that changes nothing.
        Req("management", "DELETE", "/models/nope/"),
        Req("management", "GET", "/models/tiny/"),
        Req("management", "GET", "/models/tiny/all"),
        Req("metrics", "GET", "/metrics", "name[]=%ff"),
        Req("metrics", "GET", "/metrics", "", (("Accept", "text/\xff"),)),
        Req("metrics", "GET", "/nothing"),
    ]
    return reqs
