"""The response cache on a real server, over every protocol: TorchServe REST and gRPC, OIP REST
(httpx and tritonclient.http) and OIP gRPC (tritonclient.grpc). A hit is told from a miss by the
statistics: a hit adds to ``cache_hit`` and ``success`` but no batch runs (``execution_count``
unchanged) and, as Triton counts, no inference (``inference_count`` unchanged); a miss runs one.

Models (real archives, our archiver): ``sub`` (TorchScript ``a - b``, the tensor handler; cache
of at most 2 answers), ``probe`` 1.0 and 2.0 (the probe handler, JSON in and out), ``stream``
(the streaming test handler), ``fault`` (the fault handler: too many headers on request),
``unsendable`` (an OIP handler whose answers gRPC cannot send, ``UNSENDABLE``) and ``plain`` (the
probe handler, no cache)."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
import tritonclient.utils.shared_memory as shm

from .conftest import ASSETS, LiveServer, build_store, make_config, oip_client, scripted_archive
from .test_oip import A, B, Sub, sub_inputs

_MODULES: dict[str, Any] = {"http": triton_http, "grpc": triton_grpc}

pytestmark = pytest.mark.slow

SUB = {
    "inputs": [
        {"name": "a", "datatype": "FP32", "shape": [-1, 3]},
        {"name": "b", "datatype": "FP32", "shape": [-1, 3]},
    ],
    "outputs": [{"name": "diff", "datatype": "FP32", "shape": [-1, 3]}],
}
MODELS = {
    "sub": {
        "1": {
            "marName": "sub.mar",
            "responseCache": {"enable": True, "maxEntries": 2},
            "priorityLevels": 2,
            "defaultPriorityLevel": 2,
        }
    },
    "probe": {
        "1.0": {"marName": "probe.mar", "responseCache": True, "defaultVersion": True},
        "2.0": {"marName": "probe-v2.mar", "responseCache": True},
    },
    "stream": {"1.0": {"marName": "stream.mar", "responseCache": True}},
    "fault": {"1.0": {"marName": "fault.mar", "responseCache": True}},
    "unsendable": {"1.0": {"marName": "unsendable.mar", "responseCache": True}},
    "plain": {"1.0": {"marName": "plain.mar"}},
}
# A handler's mistake: a response parameter that is no Unicode text (a lone surrogate). JSON
# escapes it (OIP over HTTP sends it); a protobuf string cannot hold it (ModelInfer cannot).
UNSENDABLE = """
from torchbay.handlers.base_handler import BaseHandler


class Unsendable(BaseHandler):
    supports_v2 = True

    def handle(self, data, context):
        out = {"name": "out", "datatype": "INT64", "shape": [1], "data": [1]}
        return [{"outputs": [out], "parameters": {"note": "\\ud800"}} for _ in data]
"""


def _store(tmp_path_factory: pytest.TempPathFactory, versioned_store: Path) -> Path:
    probe = str(ASSETS / "probe_handler.py")
    handlers = {"stream": str(ASSETS / "stream_handler.py"), "plain": probe}
    handlers["fault"] = str(ASSETS / "fault_handler.py")
    unsendable = tmp_path_factory.mktemp("cache-handler") / "unsendable_handler.py"
    unsendable.write_text(UNSENDABLE)
    handlers["unsendable"] = str(unsendable)
    root = build_store(tmp_path_factory, "cache", handlers)
    for name in ("probe.mar", "probe-v2.mar"):
        shutil.copy(versioned_store / name, root / name)
    work = tmp_path_factory.mktemp("cache-build")
    (work / "sub.yaml").write_text(json.dumps(SUB))  # JSON is YAML
    scripted_archive(Sub(), "sub", work, root, config_file=work / "sub.yaml")
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, versioned_store: Path) -> Iterator[LiveServer]:
    store = _store(tmp_path_factory, versioned_store)
    config = make_config(
        store, load_models=["all"], models=MODELS, enable_model_api=True, allow_client_shm=True
    )
    live = LiveServer(config).start()
    yield live
    live.stop()


def _stats(server: LiveServer, name: str, version: str) -> dict[str, int]:
    server.recorded()
    url = f"{server.url}/v2/models/{name}/versions/{version}/stats"
    (entry,) = httpx.get(url, timeout=30).json()["model_stats"]
    inference = entry["inference_stats"]
    return {
        "hit": inference["cache_hit"]["count"],
        "miss": inference["cache_miss"]["count"],
        "executed": entry["execution_count"],
        "inferences": entry["inference_count"],
        "success": inference["success"]["count"],
        "queued": inference["queue"]["count"],  # Triton's queue count holds hits too
    }


def _moved(server: LiveServer, name: str, version: str, run: Callable[[], Any]) -> dict[str, int]:
    """What ``run`` moved in ``name``'s statistics."""
    before = _stats(server, name, version)
    run()
    after = _stats(server, name, version)
    return {k: after[k] - before[k] for k in after}


HIT = {"hit": 1, "miss": 0, "executed": 0, "inferences": 0, "success": 1, "queued": 1}
MISS = {"hit": 0, "miss": 1, "executed": 1, "inferences": 1, "success": 1, "queued": 1}
UNCACHED = {"hit": 0, "miss": 0, "executed": 1, "inferences": 1, "success": 1, "queued": 1}


def _post(server: LiveServer, path: str, **kw: Any) -> httpx.Response:
    response = httpx.post(f"{server.url}{path}", timeout=60, **kw)
    assert response.status_code == 200, response.text
    return response


def _posted(server: LiveServer, model: str, version: str, path: str, **kw: Any) -> dict[str, int]:
    """What one POST of ``path`` moved in ``model``'s statistics."""
    return _moved(server, model, version, lambda: _post(server, path, **kw))


def test_torchserve_rest_repeats_are_hits_and_other_requests_miss(server: LiveServer) -> None:
    body = {"echo": "ts-rest"}
    first = _post(server, "/predictions/probe", json=body)
    again: list[httpx.Response] = []
    repeat = lambda: again.append(_post(server, "/predictions/probe", json=body))  # noqa: E731
    assert _moved(server, "probe", "1.0", repeat) == HIT
    assert again[0].json() == first.json()  # the stored answer, the worker's pid included
    assert again[0].headers["content-type"] == first.headers["content-type"]
    for path, headers, other in (
        ("/predictions/probe", {}, {"echo": "other"}),  # another body
        ("/predictions/probe?x=1", {}, body),  # another query
        ("/predictions/probe", {"x-tenant": "b"}, body),  # another header the handler sees
    ):
        assert _posted(server, "probe", "1.0", path, json=other, headers=headers) == MISS
    # The switch-off: neither answered from the cache nor counted in it.
    off = {"cache-control": "no-store"}
    skipped = _posted(server, "probe", "1.0", "/predictions/probe", json=body, headers=off)
    assert skipped == UNCACHED


def test_a_request_s_cache_directives_are_honoured_as_rfc_9111_says(server: LiveServer) -> None:
    """``Cache-Control: no-cache``, ``max-age=0`` and HTTP/1.0's ``Pragma: no-cache`` (when
    there is no Cache-Control) keep the stored answer from answering: the model runs and its
    answer replaces it (the probe's answer lists the echoes its worker ran: it changes each
    run). ``max-age`` of an hour takes the stored one; ``no-store`` neither reads nor stores;
    ``only-if-cached`` takes the stored one, or is a 504 that runs nothing."""
    body = {"echo": "directives", "ran": True}
    answers: list[Any] = []

    def ask(headers: dict[str, str]) -> Callable[[], None]:
        def run() -> None:
            answers.append(_post(server, "/predictions/probe", json=body, headers=headers).json())

        return run

    assert _moved(server, "probe", "1.0", ask({})) == MISS
    cases = [
        ({"pragma": "no-cache"}, MISS),
        ({"pragma": "no-cache"}, MISS),  # each time: it is no key of its own
        ({}, HIT),
        ({"Cache-Control": "max-age=0"}, MISS),
        ({"cache-control": "max-age=3600"}, HIT),
        ({"cache-control": "max-age=3600", "pragma": "no-cache"}, HIT),  # Pragma is ignored
        ({"cache-control": "No-Cache"}, MISS),
        ({"cache-control": "no-store"}, UNCACHED),
        ({}, HIT),
    ]
    for headers, expected in cases:
        assert _moved(server, "probe", "1.0", ask(headers)) == expected, headers
    # only-if-cached: the stored answer, or a 504 without running the model.
    assert _moved(server, "probe", "1.0", ask({"cache-control": "only-if-cached"})) == HIT
    unseen = lambda: _post_only_if_cached(server, {"echo": "never stored"})  # noqa: E731
    refused = {"hit": 0, "miss": 0, "executed": 0, "inferences": 0, "success": 0, "queued": 0}
    assert _moved(server, "probe", "1.0", unseen) == refused
    ran = [answer["ran"].count("directives") for answer in answers[:-1]]
    # Each miss ran the model once more; each hit answered the latest stored answer (no-store's
    # was not stored).
    assert ran == [1, 2, 3, 3, 4, 4, 4, 5, 6, 5], answers


def _post_only_if_cached(
    server: LiveServer, body: dict[str, Any], path: str = "/predictions/probe"
) -> None:
    only = {"cache-control": "only-if-cached"}
    response = httpx.post(f"{server.url}{path}", json=body, headers=only, timeout=60)
    assert response.status_code == 504 and "only-if-cached" in response.text, response.text


def test_a_new_version_never_answers_from_another_versions_entries(server: LiveServer) -> None:
    body = {"echo": "versions"}
    _post(server, "/predictions/probe/1.0", json=body)
    assert _posted(server, "probe", "2.0", "/predictions/probe/2.0", json=body) == MISS
    assert _posted(server, "probe", "2.0", "/predictions/probe/2.0", json=body) == HIT


def _v2(a: np.ndarray, **extra: Any) -> dict[str, Any]:
    inputs = [
        {"name": "a", "shape": list(a.shape), "datatype": "FP32", "data": a.ravel().tolist()},
        {"name": "b", "shape": list(B.shape), "datatype": "FP32", "data": B.ravel().tolist()},
    ]
    return {"inputs": inputs, **extra}


def test_oip_rest_json_repeats_are_hits_and_what_differs_misses(server: LiveServer) -> None:
    url = "/v2/models/sub/infer"
    body = _v2(A, id="j1")
    assert _moved(server, "sub", "1", lambda: _post(server, url, json=body)) == MISS
    hit: list[httpx.Response] = []
    assert _moved(server, "sub", "1", lambda: hit.append(_post(server, url, json=body))) == HIT
    assert hit[0].json()["id"] == "j1" and hit[0].json()["outputs"][0]["data"] == [4.0, 5.0, 6.0]
    # Another id is a hit (Triton's key has none) answered with its own id; httpx takes gzip,
    # so the answer came compressed: it is held inflated.
    other_id = lambda: hit.append(_post(server, url, json=_v2(A, id="j2")))  # noqa: E731
    assert _moved(server, "sub", "1", other_id) == HIT
    assert hit[1].json() == {**hit[0].json(), "id": "j2"}
    different = [
        _v2(A + 1, id="j1"),  # other input bytes
        _v2(A, id="j1", outputs=[{"name": "diff"}]),  # other requested outputs
        _v2(A, id="j1", parameters={"note": 1}),  # other parameters
    ]
    for other in different:
        assert _moved(server, "sub", "1", lambda o=other: _post(server, url, json=o)) == MISS


def _level_answers(server: LiveServer) -> list[dict[str, int]]:
    """``sub``'s answers by priority level (describe's ``queueLevels``), level 1 first."""
    server.recorded()
    described = httpx.get(f"{server.management_url}/models/sub", timeout=30).json()[0]
    return [level["requests"] for level in described["queueLevels"]]


def test_a_hit_is_counted_at_its_priority_level(server: LiveServer) -> None:
    """A hit is an answered request of its level: describe's and the metrics' per-level counts
    hold it, as the request's other counters do."""
    body = _v2(A * 5, parameters={"priority": 1})
    before = _level_answers(server)
    assert (
        _moved(server, "sub", "1", lambda: _post(server, "/v2/models/sub/infer", json=body)) == MISS
    )
    assert (
        _moved(server, "sub", "1", lambda: _post(server, "/v2/models/sub/infer", json=body)) == HIT
    )
    after = _level_answers(server)
    assert after[0].get("200", 0) - before[0].get("200", 0) == 2
    assert after[1] == before[1]


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_another_request_id_is_a_hit_answered_with_its_own_id(
    server: LiveServer, kind: str
) -> None:
    """Triton's key has no request id: tritonclient's request_id does not keep a repeat from
    being a hit, and the hit's answer carries the asking request's id (binary outputs too)."""
    module = _MODULES[kind]
    a = A * (8 if kind == "http" else 9)
    out = [module.InferRequestedOutput("diff")]
    answers: list[Any] = []
    with oip_client(server, kind) as client:

        def infer(rid: str) -> None:
            answers.append(client.infer("sub", sub_inputs(module, a), outputs=out, request_id=rid))

        assert _moved(server, "sub", "1", lambda: infer("first")) == MISS
        assert _moved(server, "sub", "1", lambda: infer("second")) == HIT
        assert _moved(server, "sub", "1", lambda: infer("first")) == HIT
    ids = [r.get_response()["id"] if kind == "http" else r.get_response().id for r in answers]
    assert ids == ["first", "second", "first"]
    for answer in answers:
        np.testing.assert_array_equal(answer.as_numpy("diff"), a - B)


def test_another_priority_or_timeout_is_a_hit(server: LiveServer) -> None:
    """Priority and timeout say when a request runs, not what it answers: Triton's key has
    neither. A priority past the model's levels is its default level (Triton's), a hit too; one
    past any model's levels (16) is still a 400, hit or not."""
    url = "/v2/models/sub/infer"
    first = _v2(A * 6, parameters={"priority": 2, "timeout": 5_000_000})
    assert _moved(server, "sub", "1", lambda: _post(server, url, json=first)) == MISS
    for params in (
        {"priority": 1},
        {"timeout": 7_000_000},
        {"priority": 1, "timeout": 9},
        {"priority": 3},
    ):
        again = _v2(A * 6, parameters=params)
        assert _moved(server, "sub", "1", lambda a=again: _post(server, url, json=a)) == HIT
    refused = httpx.post(f"{server.url}{url}", json=_v2(A * 6, parameters={"priority": 17}))
    assert refused.status_code == 400 and "priority" in refused.text, refused.text
    client = triton_grpc.InferenceServerClient(
        f"127.0.0.1:{server.server.state.ports.grpc_inference}"
    )
    try:
        a = A * 7
        assert (
            _moved(server, "sub", "1", lambda: _infer(triton_grpc, client, a, priority=1)) == MISS
        )
        for kw in ({"priority": 2}, {"timeout": 4_000_000}):
            assert (
                _moved(server, "sub", "1", lambda k=kw: _infer(triton_grpc, client, a, **k)) == HIT
            )
    finally:
        client.close()
    body, timeout = {"echo": "scheduled"}, {"x-torchbay-timeout-us": "5000000"}
    _post(server, "/predictions/probe", json=body)
    assert _posted(server, "probe", "1.0", "/predictions/probe", json=body, headers=timeout) == HIT


def _infer(module: Any, client: Any, a: np.ndarray, **kw: Any) -> np.ndarray:
    return client.infer("sub", sub_inputs(module, a), **kw).as_numpy("diff")


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_tritonclient_repeats_are_hits(server: LiveServer, kind: str) -> None:
    module = _MODULES[kind]
    a = A * (3 if kind == "http" else 4)
    with oip_client(server, kind) as client:
        out: list[np.ndarray] = []
        assert _moved(server, "sub", "1", lambda: out.append(_infer(module, client, a))) == MISS
        assert _moved(server, "sub", "1", lambda: out.append(_infer(module, client, a))) == HIT
        np.testing.assert_array_equal(out[1], a - B)
        other = a + 1
        assert _moved(server, "sub", "1", lambda: _infer(module, client, other)) == MISS
        off = {"cache-control": "no-store"}
        skip = _moved(server, "sub", "1", lambda: _infer(module, client, a, headers=off))
        assert skip == UNCACHED
        fresh = {"cache-control": "no-cache"}  # not answered from the cache: run, and stored
        again = _moved(server, "sub", "1", lambda: _infer(module, client, a, headers=fresh))
        assert again == MISS


def test_torchserve_grpc_repeats_are_hits(server: LiveServer, ts_stubs: SimpleNamespace) -> None:
    """Predictions caches as REST does; StreamPredictions, a streaming call, never looks up."""
    channel = grpc.insecure_channel(f"127.0.0.1:{server.server.state.ports.grpc_inference}")
    stub = ts_stubs.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
    data = json.dumps({"plain": "ts-grpc"}).encode()
    request = ts_stubs.inference_pb2.PredictionsRequest(model_name="stream", input={"data": data})
    try:
        answers: list[Any] = []
        for expected in (MISS, HIT):
            call = lambda: answers.append(stub.Predictions(request))  # noqa: E731
            assert _moved(server, "stream", "1.0", call) == expected
        assert answers[0].prediction == answers[1].prediction
        streamed = lambda: list(stub.StreamPredictions(request))  # noqa: E731
        assert _moved(server, "stream", "1.0", streamed) == UNCACHED
    finally:
        channel.close()


def test_a_streamed_answer_is_never_cached(server: LiveServer) -> None:
    streamed = {"yield": ["a", "b"]}
    for _ in range(2):  # looked up, run, and not stored: it streamed
        assert _posted(server, "stream", "1.0", "/predictions/stream", json=streamed) == MISS
    plain = {"plain": 1}  # the same model's answers that do not stream are cached
    _post(server, "/predictions/stream", json=plain)
    assert _posted(server, "stream", "1.0", "/predictions/stream", json=plain) == HIT
    # A streaming call is never answered from the cache: only-if-cached is its 504, unrun.
    path, body = "/v2/models/stream/generate_stream", {"text_input": "a b"}
    unrun = {"hit": 0, "miss": 0, "executed": 0, "success": 0}
    moved = _moved(server, "stream", "1.0", lambda: _post_only_if_cached(server, body, path))
    assert {k: moved[k] for k in unrun} == unrun


def test_an_oip_answer_that_failed_is_never_a_hit(server: LiveServer) -> None:
    """A handler that answers nothing (a generator that yields nothing) is OIP's 500 "The model
    gave no response": a failure, never stored, so each time a miss that runs the model."""
    ports = server.server.state.ports
    clients = (
        (triton_http, triton_http.InferenceServerClient(f"127.0.0.1:{ports.inference}")),
        (triton_grpc, triton_grpc.InferenceServerClient(f"127.0.0.1:{ports.grpc_inference}")),
    )
    # A failure is in no queue count (Triton's UpdateFailure counts only the failure).
    failed = {"hit": 0, "miss": 1, "executed": 1, "inferences": 0, "success": 0, "queued": 0}
    try:
        for module, client in clients:
            tensor = module.InferInput("INPUT0", [1], "BYTES")
            tensor.set_data_from_numpy(np.array([b'{"yield": []}'], dtype=object))
            for _ in range(2):

                def refused(m: Any = module, c: Any = client, t: Any = tensor) -> None:
                    with pytest.raises(m.InferenceServerException, match="gave no response"):
                        c.infer("stream", [t])

                assert _moved(server, "stream", "1.0", refused) == failed
    finally:
        for _, client in clients:
            client.close()


def test_an_answer_the_protocol_could_not_send_is_never_a_hit(server: LiveServer) -> None:
    """A worker's 200 that the protocol cannot answer is a failure, each time: never stored,
    so never replayed from the cache (Triton caches only what it answered). Over HTTP: a
    handler that sets more header bytes than HTTP answers (500); over gRPC ModelInfer: an
    answer that makes no ModelInferResponse (a response parameter that is no Unicode text,
    ``UNSENDABLE``), which the statistics count as the failure it is, not a success."""
    failed = {"hit": 0, "miss": 1, "executed": 1, "success": 0}
    for _ in range(2):
        moved = _moved(server, "fault", "1.0", lambda: _refused(server, {"headers": 200}))
        assert {k: moved[k] for k in failed} == failed
    with oip_client(server, "grpc") as client:

        def broken() -> None:
            with pytest.raises(triton_grpc.InferenceServerException, match="malformed"):
                client.infer("unsendable", sub_inputs(triton_grpc, A * 11))

        for _ in range(2):
            moved = _moved(server, "unsendable", "1.0", broken)
            assert {k: moved[k] for k in failed} == failed


def _refused(server: LiveServer, body: dict[str, Any]) -> None:
    response = httpx.post(f"{server.url}/predictions/fault", json=body, timeout=60)
    assert response.status_code == 500 and "header bytes" in response.text, response.text


def test_a_request_in_shared_memory_is_never_cached(server: LiveServer) -> None:
    """The answer lives in the client's region: a stored one could not write it there."""
    client = triton_http.InferenceServerClient(f"127.0.0.1:{server.server.state.ports.inference}")
    key = f"/tb-cache-{uuid.uuid4().hex[:12]}"
    region = shm.create_shared_memory_region("cache-out", key, A.nbytes)
    try:
        client.register_system_shared_memory("cache-out", key, A.nbytes)
        out = triton_http.InferRequestedOutput("diff")
        out.set_shared_memory("cache-out", A.nbytes)
        inputs = sub_inputs(triton_http, A * 5)
        infer = lambda: client.infer("sub", inputs, outputs=[out])  # noqa: E731
        for _ in range(2):
            shm.set_shared_memory_region(region, [np.zeros_like(A)])
            assert _moved(server, "sub", "1", infer) == UNCACHED
            written = shm.get_contents_as_numpy(region, np.float32, list(A.shape))
            np.testing.assert_array_equal(written, A * 5 - B)  # the worker wrote it each time
    finally:
        client.unregister_system_shared_memory()
        client.close()
        shm.destroy_shared_memory_region(region)


def test_lru_holds_max_entries(server: LiveServer) -> None:
    url = "/v2/models/sub/infer"
    bodies = [_v2(A + 100 + i) for i in range(3)]
    for body in bodies:  # the third pushes the first out (maxEntries 2)
        _post(server, url, json=body)
    assert _moved(server, "sub", "1", lambda: _post(server, url, json=bodies[2])) == HIT
    assert _moved(server, "sub", "1", lambda: _post(server, url, json=bodies[0])) == MISS
    server.recorded()
    metrics = httpx.get(f"{server.metrics_url}/metrics", timeout=30).text
    assert 'torchbay_cache_entries{model="sub",version="1"} 2.0' in metrics


def test_a_reload_or_an_unload_and_load_misses(server: LiveServer) -> None:
    url = "/v2/models/sub/infer"
    body = _v2(A, id="reload")
    _post(server, url, json=body)
    assert _moved(server, "sub", "1", lambda: _post(server, url, json=body)) == HIT
    config = json.dumps({"response_cache": {"enable": True}})
    load = {"parameters": {"config": config}}
    _post(server, "/v2/repository/models/sub/load", json=load)  # Triton reloads it
    assert _moved(server, "sub", "1", lambda: _post(server, url, json=body)) == MISS
    _post(server, "/v2/repository/models/sub/unload", json={})
    _post(server, "/v2/repository/models/sub/load", json={})
    assert _moved(server, "sub", "1", lambda: _post(server, url, json=body)) == MISS
    assert _moved(server, "sub", "1", lambda: _post(server, url, json=body)) == HIT


def _tune(server: LiveServer, **live: Any) -> None:
    params = {**live, "synchronous": "true"}
    tuned = httpx.put(f"{server.management_url}/models/sub/1", params=params, timeout=60)
    assert tuned.status_code == 200, tuned.text


def test_a_live_batch_size_change_empties_the_versions_cache(server: LiveServer) -> None:
    """The batch size is OIP's max_batch_size: lowered through the management API, a request
    of a larger batch is refused, and so it is when its answer was cached before (Triton's
    load of a new configuration starts with an empty cache). A live change that does not
    decide what a request may ask (the batching delay) keeps the entries."""
    rows = np.repeat(A * 12, 3, axis=0)
    data = [
        {"name": n, "shape": [3, 3], "datatype": "FP32", "data": x.ravel().tolist()}
        for n, x in (("a", rows), ("b", np.repeat(B, 3, axis=0)))
    ]
    url, body = "/v2/models/sub/infer", {"inputs": data}
    try:
        _tune(server, batch_size=4, max_batch_delay=1)
        three = {**MISS, "inferences": 3}  # Triton counts a batched request's rows
        assert _moved(server, "sub", "1", lambda: _post(server, url, json=body)) == three
        assert _moved(server, "sub", "1", lambda: _post(server, url, json=body)) == HIT
        _tune(server, max_batch_delay=2)  # when it runs, not what it may ask: still a hit
        assert _moved(server, "sub", "1", lambda: _post(server, url, json=body)) == HIT
        _tune(server, batch_size=2)
        for _ in range(2):
            refused = httpx.post(f"{server.url}{url}", json=body, timeout=60)
            assert refused.status_code == 400, refused.text
            assert "batch-size must be <= 2" in refused.text, refused.text
    finally:
        _tune(server, batch_size=1, max_batch_delay=100)


def test_torchserve_unregister_frees_the_versions_answers_at_once(server: LiveServer) -> None:
    """Not at a later scrape or another version's first look-up: those may never come."""
    params = {"url": "plain.mar", "model_name": "freed", "response_cache": "true"}
    params |= {"initial_workers": "1", "synchronous": "true"}
    registered = httpx.post(f"{server.management_url}/models", params=params, timeout=120)
    assert registered.status_code == 200, registered.text
    _post(server, "/predictions/freed", json={"echo": "freed"})
    (mv,) = server.server.registry.models["freed"].values()
    held = server.server.plane.cache._versions  # the answers held, by version
    assert len(held[mv].entries) == 1
    gone = httpx.delete(f"{server.management_url}/models/freed", timeout=120)
    assert gone.status_code == 200, gone.text
    assert mv not in held


def test_the_counters_move_in_metrics_and_hits_count_as_requests(server: LiveServer) -> None:
    def scrape() -> dict[str, float]:
        server.recorded()
        text = httpx.get(f"{server.metrics_url}/metrics", timeout=30).text
        wanted = {
            "hits": 'torchbay_cache_hits_total{model="probe",version="2.0"}',
            "misses": 'torchbay_cache_misses_total{model="probe",version="2.0"}',
            "requests": 'torchbay_requests_total{code="200",model="probe",version="2.0"}',
        }
        found = {}
        for line in text.splitlines():
            for key, prefix in wanted.items():
                if line.startswith(prefix + " "):
                    found[key] = float(line.rsplit(" ", 1)[1])
        return found

    body = {"echo": "metrics"}
    before = scrape()
    for _ in range(3):
        _post(server, "/predictions/probe/2.0", json=body)
    after = scrape()
    moved = {k: after[k] - before.get(k, 0.0) for k in after}
    assert moved == {"hits": 2.0, "misses": 1.0, "requests": 3.0}


def test_describe_and_the_model_config_show_the_setting(server: LiveServer) -> None:
    described = httpx.get(f"{server.management_url}/models/sub", timeout=30).json()[0]
    assert described["responseCache"] == {"enable": True, "maxEntries": 2, "maxBytes": 64 << 20}
    config = httpx.get(f"{server.url}/v2/models/sub/config", timeout=30).json()
    assert config["response_cache"] == {"enable": True}
    plain = httpx.get(f"{server.url}/v2/models/plain/config", timeout=30).json()
    assert plain["response_cache"] == {"enable": False}
    assert _posted(server, "plain", "1.0", "/predictions/plain", json={}) == UNCACHED


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ('{"enable": true, "maxEntries": -1}', "response_cache.maxEntries"),
        ('{"enable": true, "maxBytes": 1e30}', "response_cache.maxBytes"),
        ('{"enable": true, "maxBytes": 99999999999999999}', "response_cache.maxBytes"),
        ('{"enable": "maybe"}', "response_cache.enable"),
        ("sometimes", "response_cache"),
    ],
)
def test_bad_settings_are_400s_naming_the_field(server: LiveServer, value: str, field: str) -> None:
    params = {"url": "plain.mar", "model_name": "plain2", "response_cache": value}
    refused = httpx.post(f"{server.management_url}/models", params=params, timeout=60)
    assert refused.status_code == 400, refused.text
    assert field in refused.text and "Traceback" not in refused.text and "/" not in refused.text
    assert "plain2" not in server.server.registry.models
    config = json.dumps({"response_cache": json.loads(value) if value[0] == "{" else value})
    load = {"parameters": {"config": config}}
    triton = httpx.post(f"{server.url}/v2/repository/models/sub/load", json=load, timeout=60)
    assert triton.status_code == 400 and field in triton.json()["error"], triton.text
