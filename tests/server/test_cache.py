"""The response cache's parts (plane/cache.py, the setting in config/model_settings.py): what is
in the key and what keeps a request out of the cache, the LRU bounds, and the setting's parsing
and bounds. The live server's behaviour over every protocol: test_cache_live.py."""

from __future__ import annotations

import gzip
import json
import time
import tracemalloc
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from torchbay.server.config.model_settings import (
    SETTINGS,
    ModelConfig,
    ResponseCacheConfig,
    check_model_settings,
)
from torchbay.server.errors import BadRequest, RequestTimeout
from torchbay.server.plane.cache import (
    ResponseCache,
    VersionCache,
    entry_size,
    keyed,
    request_key,
)
from torchbay.server.plane.cache_ids import with_id, without_id
from torchbay.server.plane.describe import described
from torchbay.server.plane.load_config import load_overrides
from torchbay.server.plane.params import register_params
from torchbay.server.serving.launch import settings_from
from torchbay.server.serving.protocol import WireRequest, WireResponse

V2_BODY = json.dumps({"inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "data": [1]}]})


def _http(body: str = V2_BODY, *headers: bytes, protocol: str = "v2") -> WireRequest:
    raw = b"\r\n".join([b"host: 127.0.0.1:1", b"content-length: 99", *headers])
    return WireRequest("1", body.encode(), "application/json", protocol=protocol, raw_headers=raw)


class _Version:
    """What the cache reads of a model version: its config, its live settings, and whether it
    is unloading."""

    def __init__(self, **cache: Any) -> None:
        self.name, self.version = "m", "1"
        self.config = ModelConfig.model_validate({"responseCache": {"enable": True, **cache}})
        self.settings = SimpleNamespace(batch_size=1, max_batch_delay_ms=100.0)
        self.closing = False


def test_the_key_holds_what_can_change_the_answer() -> None:
    base = request_key(_http())
    assert base is not None and base == request_key(replace(_http(), request_id="2"))
    other_input = V2_BODY.replace("[1]}", "[2]}")
    assert request_key(_http(other_input)) != base  # the tensor's bytes
    assert request_key(_http(V2_BODY.replace("FP32", "INT32"))) != base  # its datatype
    assert request_key(_http(V2_BODY.replace('"shape": [1]', '"shape": [1, 1]'))) != base
    # Triton's key has no id: a hit gets its own put in its answer (cache_ids.py).
    with_id = lambda rid: json.dumps({"id": rid, **json.loads(V2_BODY)})  # noqa: E731
    assert request_key(_http(with_id("x"))) == request_key(_http(with_id("y")))
    gzip = b"accept-encoding: gzip"
    assert request_key(_http(with_id("x"), gzip)) == request_key(_http(with_id("y"), gzip))
    assert request_key(_http(V2_BODY, b"x-tenant: b")) != base  # the handler sees headers
    assert request_key(replace(_http(), query="a=1")) != base
    assert request_key(replace(_http(), content_type="text/plain")) != base
    assert request_key(_http(protocol="predict")) != base
    # How the body travelled is not what it asks: its length header is not in the key.
    moved = _http().raw_headers.replace(b"content-length: 99", b"content-length: 7")
    assert request_key(replace(_http(), raw_headers=moved)) == base
    assert request_key(_http(V2_BODY, b"content-encoding: identity")) is not None
    text = V2_BODY.replace('"data": [1]', r'"data": ["caf\u00e9 \u0073"]')  # escaped text
    assert request_key(_http(text)) not in (None, base)
    # A header line can not pass for the start of the body, nor the reverse.
    assert request_key(_http("x-a: b\nZ")) != request_key(_http("Z", b"x-a: b"))
    # gRPC metadata is in the key as HTTP's headers are.
    grpc = WireRequest("1", b"x", "", headers={"x-tenant": "a"}, protocol="v2")
    assert request_key(grpc) != request_key(replace(grpc, headers={"x-tenant": "b"}))


def test_a_hit_answers_with_its_own_id_in_json_or_the_binary_extension() -> None:
    head = b'{"model_name":"m","model_version":"1","id":"a","outputs":[{"name":"o"}]}'
    binary = WireResponse(200, head + b"\x00\x01", "application/octet-stream")
    binary.headers["Inference-Header-Content-Length"] = str(len(head))
    held = without_id(binary, 1 << 20)
    assert held is not None and b'"id"' not in held.body and held.body.endswith(b"\x00\x01")
    for response in (held, with_id(held, "zz")):
        n = int(response.headers["Inference-Header-Content-Length"])
        assert response.body[n:] == b"\x00\x01"
    answer = with_id(held, "zz")
    n = int(answer.headers["Inference-Header-Content-Length"])
    assert list(json.loads(answer.body[:n])) == ["id", "model_name", "model_version", "outputs"]
    assert json.loads(answer.body[:n])["id"] == "zz" and with_id(held, None) is held
    plain = WireResponse(200, b'{"id":"a","outputs":[]}')
    assert json.loads(with_id(without_id(plain, 99), "b").body) == {"id": "b", "outputs": []}
    # The id wherever it is, in whatever spacing: out, once; then the asker's alone.
    for text in (
        '{ "id" : "a" }',
        '{"model_name":"m","id":"a"}',
        '{"model_name": "m", "id": "a", "outputs": [{"id": "inner"}]}',
        '{"outputs":[{"name":"o"}],"id":"a"}',  # not the worker's order: read whole
        '{"model_name":"m","outputs":[{"name":"id"}]}',  # no id ("id" a name in the data)
    ):
        held = without_id(WireResponse(200, text.encode()), 99)
        assert held is not None and "id" not in json.loads(held.body), text
        answer = json.loads(with_id(held, "b").body)
        assert answer["id"] == "b" and with_id(held, "b").body.count(b'"b"') == 1, text
        assert answer == {**json.loads(text), "id": "b"}, text
    # An answer that came compressed is held inflated (any HTTP answer may be sent so).
    zipped = WireResponse(200, gzip.compress(plain.body), headers={"content-encoding": "gzip"})
    held = without_id(zipped, 99)
    assert held is not None and held.headers == {} and json.loads(held.body) == {"outputs": []}
    assert without_id(zipped, 10) is None  # past maxBytes inflated: not held
    broken = WireResponse(200, b"\x1f\x8b", headers={"content-encoding": "gzip"})
    assert without_id(broken, 99) is None


@pytest.mark.parametrize(
    "line",
    [
        b"x-request-id: 4f0c",  # Istio's and KServe's, new per request
        b"traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        b"x-b3-traceid: 80f198ee56343ba864fe8b2a57d3eff7",
        b"x-forwarded-for: 10.0.0.7",
        b"x-envoy-attempt-count: 2",
        b"host: torchbay.default.svc.cluster.local",
        b"user-agent: Python-urllib/3.11",
    ],
)
def test_what_a_proxy_or_tracer_sets_per_request_is_not_in_the_key(line: bytes) -> None:
    """Behind KServe every request carries its own x-request-id and trace ids: in the key, no
    repeat would ever hit (Triton's key has no header). A header of the client's own still is."""
    base = request_key(_http(V2_BODY, b"x-tenant: a"))
    assert request_key(_http(V2_BODY, b"x-tenant: a", line)) == base
    assert request_key(_http(V2_BODY, b"x-tenant: b", line)) != base
    grpc = WireRequest("1", b"x", "", headers={"x-tenant": "a"}, protocol="v2")
    name, _, value = line.decode().partition(": ")
    assert request_key(replace(grpc, headers={"x-tenant": "a", name: value})) == request_key(grpc)


def test_priority_and_timeout_are_not_in_the_key() -> None:
    """They say when a request runs, not what it answers (Triton's key has neither): over OIP
    (its parameters, REST's JSON or the binary extension's, gRPC's) and the TorchServe API (the
    x-torchbay headers), another priority or timeout is the same key; other parameters are not."""
    doc = json.loads(V2_BODY)

    def v2(*head: bytes, tail: bytes = b"", **params: Any) -> WireRequest:
        body = json.dumps({"parameters": params, **doc} if params else doc, separators=(",", ":"))
        length = [b"inference-header-content-length: %d" % len(body)] if tail else []
        return _http(body + tail.decode(), *head, *length)

    base = request_key(v2())
    for params in ({"priority": 1}, {"priority": 2, "timeout": 10}, {"timeout": 5}):
        assert request_key(v2(**params)) == base, params
    assert request_key(v2(priority=1, note="x")) == request_key(v2(priority=2, note="x")) != base
    binary = request_key(v2(tail=b"\x01\x02"))
    assert request_key(v2(tail=b"\x01\x02", timeout=9)) == binary != base
    assert request_key(v2(tail=b"\x01\x03", timeout=9)) != binary  # the tensors' bytes still
    # Two JSON lengths: the worker reads the last, the key would read the first: not cached.
    twice = v2(b"inference-header-content-length: 3", tail=b"\x01\x02")
    assert request_key(twice) is None
    grpc = WireRequest("1", b"{}", "", headers={"x-torchbay-priority": "1"}, protocol="predict")
    assert request_key(grpc) == request_key(replace(grpc, headers={}))
    ts = _http("{}", b"x-torchbay-priority: 2", b"x-torchbay-timeout-us: 9", protocol="predict")
    assert request_key(ts) == request_key(_http("{}", protocol="predict"))


def test_the_key_of_a_large_body_with_an_id_does_not_build_its_tensors() -> None:
    """Leaving the id, priority and timeout out of the key made the whole body's objects on the
    event loop (json.loads, ~8x the body's size, the GIL held: 0.35 s for 5 MB of floats).
    Now the members' texts are copied once: equal keys still."""
    data = {"inputs": [{"name": "a", "shape": [1, 300_000], "datatype": "FP32"}]}
    data["inputs"][0]["data"] = [0.25] * 300_000

    def body(**top: Any) -> str:
        return json.dumps({**top, **data})

    wire = _http(body(id="a", parameters={"priority": 2, "n": 1}))
    tracemalloc.start()
    try:
        key = request_key(wire)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < len(wire.body) * 1.5, peak  # the key's text: one copy of the body
    assert key == request_key(_http(body(parameters={"n": 1}, id="b")))
    assert key == request_key(_http(" " + body(parameters={"timeout": 9, "n": 1}, id="c") + "\n"))
    assert key != request_key(_http(body(id="c", parameters={"n": 1}, x=1)))
    assert key != request_key(_http(body(id="a", parameters={"priority": 2, "n": 2})))
    assert request_key(_http(body(id=7))) != request_key(_http(body(id=8)))  # the worker's 400


@pytest.mark.parametrize(
    "wire",
    [
        _http(V2_BODY, b"cache-control: no-store"),
        _http(V2_BODY, b"Cache-Control: max-age=60, No-Store"),
        WireRequest("1", b"{}", "", headers={"cache-control": "no-store"}, protocol="v2"),
        _http(V2_BODY.replace('"inputs"', '"parameters": {"sequence_id": 3}, "inputs"')),
        _http(V2_BODY.replace('"data": [1]', '"parameters": {"shared_memory_region": "r"}')),
        # the same names with escaped letters: the JSON parser reads them as the plain ones
        _http(V2_BODY.replace('"data": [1]', r'"parameters": {"shared_memory_regio\u006E": "r"}')),
        _http(V2_BODY.replace('"inputs"', r'"parameters": {"\u0073equence_id": 3}, "inputs"')),
        _http("{}", b"ts_request_sequence_id: 4", protocol="predict"),
        _http("\x1f\x8b", b"content-encoding: gzip"),
    ],
    ids=[
        *("no-store", "no-store-among", "grpc-no-store", "sequence", "shm", "shm-escaped"),
        *("sequence-escaped", "ts-sequence", "gzip"),
    ],
)
def test_requests_that_are_never_cached(wire: WireRequest) -> None:
    assert request_key(wire) is None


@pytest.mark.parametrize(
    ("lines", "max_age"),
    [
        ((), None),
        ((b"cache-control: no-cache",), 0.0),
        ((b"Cache-Control: MAX-AGE=0",), 0.0),
        ((b"cache-control: public, max-age=30", b"cache-control: max-age=10"), 10.0),
        ((b'cache-control: max-age="20"',), 20.0),
        ((b"cache-control: max-age=soon",), 0.0),  # malformed: no stored answer is fresh
        ((b"cache-control: max-age=99999999999999",), float(1 << 31)),
        ((b"pragma: no-cache",), 0.0),  # HTTP/1.0's no-cache
        ((b"Pragma: no-cache", b"cache-control: max-age=5"), 5.0),  # Pragma ignored then
        ((b"pragma: x-other",), None),
        ((b"cache-control: only-if-cached, max-stale",), None),  # not for this cache
        ((b"x-no-cache: 1",), None),  # not a directive
    ],
)
def test_cache_directives_are_read_as_rfc_9111_says(lines: tuple[bytes, ...], max_age: Any) -> None:
    """What a request's Cache-Control and Pragma say to the cache: how old a stored answer may
    be to answer it (0: none may); neither header is in the key."""
    found = keyed(_http(V2_BODY, *lines))
    assert found is not None and found[3] == max_age
    assert found[4] is any(b"only-if-cached" in line for line in lines)
    plain = keyed(_http(V2_BODY))
    assert plain is not None
    same = not any(line.lower().startswith(b"x-") for line in lines)
    assert (found[0] == plain[0]) is same


def test_a_stored_answer_older_than_max_age_does_not_answer() -> None:
    cache = VersionCache(ResponseCacheConfig(enable=True))
    cache.put(b"k", _answer(1))
    assert cache.get(b"k") == cache.get(b"k", 3600) == _answer(1)
    assert cache.get(b"k", 0) is None  # no-cache: the stored answer is kept for the refresh
    cache.entries[b"k"] = (*cache.entries[b"k"][:2], time.monotonic() - 20)
    assert cache.get(b"k", 10) is None and cache.get(b"k", 30) == _answer(1)


def test_a_live_batch_size_change_empties_the_cache() -> None:
    """The batch size decides which OIP requests are refused (max_batch_size): a management
    change of it empties the version's cache; the batching delay does not."""
    cache = ResponseCache()
    mv = _Version()
    cache.lookup(mv, _http(), "/p").store(_answer(1))  # type: ignore[union-attr, arg-type]
    mv.settings.max_batch_delay_ms = 5.0
    assert cache.lookup(mv, _http(), "/p").hit is not None  # type: ignore[union-attr, arg-type]
    mv.settings.batch_size = 4
    assert cache.lookup(mv, _http(), "/p").hit is None  # type: ignore[union-attr, arg-type]
    assert [e for _, e, _ in cache.sizes()] == [0]
    # A miss in flight across a change: its answer came under the old size, and is not stored.
    running = cache.lookup(mv, _http(), "/p")  # type: ignore[arg-type]
    assert running is not None
    mv.settings.batch_size = 2
    running.store(_answer(1))
    assert cache.lookup(mv, _http(), "/p").hit is None  # type: ignore[union-attr, arg-type]


def test_streaming_calls_and_disabled_versions_are_not_looked_up() -> None:
    cache = ResponseCache()
    mv = _Version()
    streaming = (
        "/v2/models/m/generate_stream",
        "/inference.GRPCInferenceService/ModelStreamInfer",
        "/org.pytorch.serve.grpc.inference.InferenceAPIsService/StreamPredictions2",
    )
    for path in streaming:
        assert cache.lookup(mv, _http(), path) is None  # type: ignore[arg-type]
    assert cache.lookup(mv, _http(), "/v2/models/m/infer") is not None  # type: ignore[arg-type]
    off = _Version()
    off.config = ModelConfig()
    assert cache.lookup(off, _http(), "/v2/models/m/infer") is None  # type: ignore[arg-type]


def test_only_if_cached_is_a_504_for_what_the_cache_never_holds() -> None:
    """A caching version's request that asks ``only-if-cached`` but is never cached (a stream,
    a sequence's request, ``no-store``, in any case) can have no stored answer: RFC 9111's 504,
    as for a miss; the model must not run. Without a cache, the directive is not ours."""
    cache, mv = ResponseCache(), _Version()
    only = b"Cache-Control: max-age=5, Only-If-Cached"
    never = [
        (_http("{}", only), "/v2/models/m/generate_stream", True),
        (_http("{}", only), "/v2/models/m/infer", False),  # a sequence's request
        (_http("{}", b"cache-control: no-store, only-if-cached"), "/v2/models/m/infer", True),
    ]
    for wire, path, cacheable in never:
        with pytest.raises(RequestTimeout, match="only-if-cached"):
            cache.lookup(mv, wire, path, cacheable)  # type: ignore[arg-type]
    grpc = replace(_http("{}"), headers={"cache-control": "only-if-cached"})
    with pytest.raises(RequestTimeout):
        cache.lookup(mv, grpc, "/inference.GRPCInferenceService/ModelStreamInfer")  # type: ignore[arg-type]
    assert cache.lookup(mv, _http("{}"), "/v2/models/m/generate_stream") is None  # type: ignore[arg-type]
    off = _Version()
    off.config = ModelConfig()
    assert cache.lookup(off, _http("{}", only), "/v2/models/m/infer") is None  # type: ignore[arg-type]


def _answer(size: int, status: int = 200, partial: bool = False) -> WireResponse:
    return WireResponse(status, b"x" * size, partial=partial)


def test_a_miss_stores_a_whole_200_and_a_hit_returns_it() -> None:
    counted: list[tuple[bool, float]] = []
    cache = ResponseCache(lambda mv, hit, seconds: counted.append((hit, seconds)))
    mv = _Version()
    path = "/predictions/m"
    for answer in (_answer(3, status=500), _answer(3, partial=True), None):
        miss = cache.lookup(mv, _http(), path)  # type: ignore[arg-type]
        assert miss is not None and miss.hit is None
        miss.store(answer)
    assert [hit for hit, _ in counted] == [False] * 3  # each miss counted, nothing stored
    cache.lookup(mv, _http(), path).store(_answer(3))  # type: ignore[union-attr, arg-type]
    hit = cache.lookup(mv, _http(), path)  # type: ignore[arg-type]
    assert hit is not None and hit.hit == _answer(3)
    assert [h for h, _ in counted] == [False] * 4 + [True] and all(s >= 0 for _, s in counted)
    cache.clear(mv)  # type: ignore[arg-type]
    assert cache.lookup(mv, _http(), path).hit is None  # type: ignore[union-attr, arg-type]


def test_a_withdrawn_answer_is_dropped_unless_another_miss_replaced_it() -> None:
    """A miss whose protocol could not answer it 200 withdraws what it stored; an answer a
    concurrent miss of the same key stored since is that one's, and stays."""
    cache = ResponseCache()
    mv = _Version()
    first, second = (cache.lookup(mv, _http(), "/p") for _ in range(2))  # type: ignore[arg-type]
    assert first is not None and second is not None and second.hit is None
    first.store(_answer(1))
    first.withdraw()
    assert cache.lookup(mv, _http(), "/p").hit is None  # type: ignore[union-attr, arg-type]
    first.store(_answer(1))
    second.store(_answer(2))  # replaces it
    first.withdraw()
    assert cache.lookup(mv, _http(), "/p").hit == _answer(2)  # type: ignore[union-attr, arg-type]


def test_entries_are_bounded_least_recently_used_first() -> None:
    one = entry_size(b"k" * 16, _answer(100))
    cache = VersionCache(ResponseCacheConfig(enable=True, maxEntries=2, maxBytes=10 * one))
    for key in (b"a", b"b"):
        assert cache.put(key.ljust(16), _answer(100))
    assert cache.get(b"a".ljust(16)) is not None  # "a" is now the most recently used
    cache.put(b"c".ljust(16), _answer(100))
    assert cache.get(b"b".ljust(16)) is None and len(cache.entries) == 2
    assert cache.bytes == 2 * one
    by_bytes = VersionCache(ResponseCacheConfig(enable=True, maxBytes=2 * one + 1))
    for key in (b"a", b"b", b"c"):
        by_bytes.put(key.ljust(16), _answer(100))
    assert list(by_bytes.entries) == [b"b".ljust(16), b"c".ljust(16)]
    assert by_bytes.bytes == 2 * one <= by_bytes.settings.max_bytes
    # An answer larger than maxBytes is not stored, and evicts nothing.
    assert not by_bytes.put(b"d".ljust(16), _answer(3 * one))
    assert len(by_bytes.entries) == 2


def test_an_unloaded_versions_answers_are_freed() -> None:
    cache = ResponseCache()
    mv = _Version()
    cache.lookup(mv, _http(), "/p").store(_answer(1))  # type: ignore[union-attr, arg-type]
    assert [(e, b > 0) for _, e, b in cache.sizes()] == [(1, True)]
    mv.closing = True
    assert list(cache.sizes()) == []
    assert cache.lookup(mv, _http(), "/p") is None  # type: ignore[arg-type]


def test_the_setting_parses_its_forms_and_refuses_bad_values_by_name() -> None:
    parse = ResponseCacheConfig.model_validate
    assert parse(True) == parse({"enable": True}) == parse("true") == parse('{"enable": true}')
    assert parse("false").enable is False and ResponseCacheConfig().enable is False
    config = ModelConfig.model_validate({"responseCache": {"enable": True, "maxEntries": 5}})
    assert (config.response_cache.max_entries, config.response_cache.max_bytes) == (5, 64 << 20)
    bad = [
        ({"maxEntries": -1}, "responseCache.maxEntries"),
        ({"maxEntries": 10**9}, "responseCache.maxEntries"),
        ({"maxBytes": 0}, "responseCache.maxBytes"),
        ({"maxBytes": 1 << 60}, "responseCache.maxBytes"),
        ({"enable": "maybe"}, "responseCache.enable"),
        ({"maxentries": 3}, "responseCache.maxentries"),
        ("junk", "responseCache"),
    ]
    for value, where in bad:
        with pytest.raises(ValidationError, match=rf"(?m)^{where}$"):
            ModelConfig.model_validate({"responseCache": value})


def test_the_management_api_and_triton_load_take_the_setting() -> None:
    params = register_params(
        {"url": "m.mar", "response_cache": '{"enable": true, "maxEntries": 4}'}
    )
    assert params.response_cache == ResponseCacheConfig(enable=True, maxEntries=4)
    check_model_settings(params.model_dump())  # the nested object bounds itself
    with pytest.raises(ValidationError, match=r"response_cache\.maxBytes"):
        register_params({"url": "m.mar", "response_cache": '{"maxBytes": -5}'})
    config = json.dumps({"response_cache": {"enable": True}})
    overrides, _ = load_overrides("m", {"config": config})
    assert overrides == {"response_cache": ResponseCacheConfig(enable=True)}
    refused = json.dumps({"response_cache": {"enable": True, "maxEntries": 0}})
    with pytest.raises(BadRequest, match=r"response_cache\.maxEntries"):
        load_overrides("m", {"config": refused})


def test_describe_shows_the_setting_by_its_yaml_keys() -> None:
    config = ModelConfig.model_validate({"responseCache": True})
    shown = described(SETTINGS, settings_from(config), config, "workers")["responseCache"]
    assert shown == {"enable": True, "maxEntries": 1024, "maxBytes": 64 << 20}
