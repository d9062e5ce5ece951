"""The management API on a live server: register, describe, scale, set-default, unregister,
with inference traffic flowing the whole time, and the error answers TorchServe users expect."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from .conftest import probe_models, until

pytestmark = pytest.mark.slow


class Traffic:
    """Background clients posting to /predictions/probe until stopped; every outcome recorded."""

    def __init__(self, url: str, clients: int = 3) -> None:
        self.url = url
        self.stop = threading.Event()
        self.lock = threading.Condition()
        self.results: list[tuple[int, dict[str, Any]]] = []
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(clients)]

    def _run(self, client_id: int) -> None:
        n = 0
        with httpx.Client(timeout=60) as client:
            while not self.stop.is_set():
                n += 1
                try:
                    r = client.post(self.url, json={"sleep": 0.05, "echo": f"{client_id}-{n}"})
                except httpx.HTTPError as exc:  # no answer at all: a failure too
                    with self.lock:
                        self.errors.append(exc)
                    continue
                with self.lock:
                    self.results.append((r.status_code, r.json()))
                    self.lock.notify_all()

    def __enter__(self) -> Traffic:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def count(self) -> int:
        with self.lock:
            return len(self.results)

    def wait_for_more(self, n: int) -> None:
        """Block until ``n`` more answers arrived (the traffic really flows across each step)."""
        with self.lock:
            target = len(self.results) + n
            assert self.lock.wait_for(lambda: len(self.results) >= target, timeout=60)


def test_lifecycle_under_continuous_traffic(live_server, versioned_store, request):
    server = live_server(
        model_store=versioned_store,
        models=probe_models(batchSize=2, maxBatchDelay=10),
        enable_model_api=True,
    )
    m = httpx.Client(base_url=server.management_url, timeout=120)
    request.addfinalizer(m.close)
    with Traffic(f"{server.url}/predictions/probe") as traffic:
        traffic.wait_for_more(5)
        r = m.post("/models", params={"url": "probe-v2.mar", "initial_workers": 1})
        assert r.status_code == 200, r.text
        assert r.json() == {
            "status": 'Model "probe" Version: 2.0 registered with 1 initial workers'
        }
        assert m.post("/models", params={"url": "probe-v2.mar"}).status_code == 409

        both = m.get("/models/probe/all").json()
        assert sorted(d["modelVersion"] for d in both) == ["1.0", "2.0"]
        assert {d["modelVersion"]: d["isDefault"] for d in both} == {"1.0": True, "2.0": False}

        r = m.put("/models/probe/1.0", params={"min_worker": 2, "synchronous": "true"})
        assert r.status_code == 200, r.text
        assert r.json() == {"status": "Workers scaled to 2 for model: probe, version: 1.0"}
        [v1] = m.get("/models/probe/1.0").json()
        assert (v1["minWorkers"], v1["maxWorkers"]) == (2, 2)
        assert [w["status"] for w in v1["workers"]] == ["READY"] * 2  # busy ones too
        assert {w["state"] for w in v1["workers"]} <= {"READY", "BUSY"}
        assert all(w["memoryUsage"] > 1_000_000 for w in v1["workers"])  # real RSS, bytes
        assert v1["metrics"]["requests"] > 0 and v1["metrics"]["rejectedRequests"] == 0
        traffic.wait_for_more(10)

        r = m.put("/models/probe/1.0", params={"min_worker": 1, "synchronous": "true"})
        assert r.status_code == 200 and r.json()["status"].startswith("Workers scaled to 1")
        # Answered at once, as TorchServe's: a worker that leaves while it runs a batch
        # finishes it first, described UNLOADING (DRAINING) meanwhile.
        [v1] = m.get("/models/probe/1.0").json()
        assert [w["status"] for w in v1["workers"] if w["state"] != "DRAINING"] == ["READY"]
        assert {w["status"] for w in v1["workers"] if w["state"] == "DRAINING"} <= {"UNLOADING"}
        until(lambda: len(m.get("/models/probe/1.0").json()[0]["workers"]) == 1, "one worker")
        traffic.wait_for_more(10)

        refused = m.delete("/models/probe/1.0")
        assert refused.status_code == 403, refused.text
        assert refused.json()["type"] == "DefaultVersionInUse"

        r = m.put("/models/probe/2.0/set-default")
        assert r.status_code == 200, r.text
        [v2] = m.get("/models/probe").json()
        assert v2["modelVersion"] == "2.0" and v2["isDefault"]
        v2_pids = {w["pid"] for w in v2["workers"]}
        direct = httpx.post(f"{server.url}/predictions/probe", json={"echo": "v2"}, timeout=60)
        assert direct.json()["pid"] in v2_pids
        traffic.wait_for_more(5)

        r = m.delete("/models/probe/1.0")
        assert r.status_code == 200 and r.json() == {"status": 'Model "probe" unregistered'}
        traffic.wait_for_more(5)

    assert traffic.errors == []
    statuses = [status for status, _ in traffic.results]
    assert len(statuses) >= 35
    assert statuses == [200] * len(statuses), [b for s, b in traffic.results if s != 200][:3]
    echoes = [body["echo"] for _, body in traffic.results]
    assert len(set(echoes)) == len(echoes)  # exactly one answer per request
    assert m.get("/models").json() == {
        "models": [{"modelName": "probe", "modelUrl": "probe-v2.mar"}]
    }
    assert [d["modelVersion"] for d in m.get("/models/probe/all").json()] == ["2.0"]
    assert m.get("/models/probe/1.0").status_code == 404


def test_registration_scaling_and_errors_without_workers(live_server, versioned_store, request):
    server = live_server(model_store=versioned_store, enable_model_api=True)
    m = httpx.Client(base_url=server.management_url, timeout=60)
    request.addfinalizer(m.close)

    r = m.post("/models", params={"url": "tiny.mar", "initial_workers": 0})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == (
        'Model "tiny" Version: 1.0 registered with 0 initial workers. '
        "Use scale workers API to add workers for the model."
    )
    # A JSON body works like the query string; with no worker to start, TorchServe answers 200.
    r = m.post(
        "/models",
        json={"url": "tiny.mar", "model_name": "tiny2", "initial_workers": 0, "batch_size": 4,
              "max_batch_delay": 7, "synchronous": False},
    )  # fmt: skip
    assert r.status_code == 200 and "tiny2" in r.json()["status"]
    [tiny2] = m.get("/models/tiny2").json()
    assert (tiny2["batchSize"], tiny2["maxBatchDelay"]) == (4, 7)

    listing = m.get("/models", params={"limit": 1}).json()
    assert listing == {
        "nextPageToken": "1",
        "models": [{"modelName": "tiny", "modelUrl": "tiny.mar"}],
    }
    assert m.get("/models", params={"limit": 1, "next_page_token": 1}).json() == {
        "nextPageToken": "2",  # TorchServe 0.12: there unless the page ran past the end
        "models": [{"modelName": "tiny2", "modelUrl": "tiny.mar"}],
    }
    assert m.get("/v1/models/tiny").json() == {"name": "tiny", "ready": False}
    assert httpx.post(f"{server.url}/predictions/tiny", content=b"x").status_code == 503

    # Live tuning without touching workers.
    r = m.put("/models/tiny", params={"batch_size": 8, "max_batch_delay": 3})
    assert r.status_code == 202
    r = m.put("/models/tiny/1.0", params={"min_worker": 0, "synchronous": True})
    assert r.json() == {"status": "Workers scaled to 0 for model: tiny, version: 1.0"}
    [tiny] = m.get("/models/tiny").json()
    assert (tiny["batchSize"], tiny["maxBatchDelay"], tiny["workers"]) == (8, 3, [])

    def error(r: httpx.Response, status: int, type_: str) -> None:
        assert r.status_code == status, r.text
        body = r.json()
        assert body["code"] == status and body["type"] == type_ and body["message"]

    error(m.post("/models", params={"url": "tiny.mar", "initial_workers": 0}), 409, "Conflict")
    # TorchServe's parsing: a junk or non-positive batch_size is the default.
    error(m.post("/models", params={"url": "tiny.mar", "batch_size": 0}), 409, "Conflict")
    error(m.post("/models", params={"url": "tiny.mar", "batch_size": "x"}), 409, "Conflict")
    error(m.post("/models"), 400, "BadRequest")
    # TorchServe 0.12: 404 "Relative path is not allowed in url" for any "..", inside or not
    # (tests/data/torchserve/url_forms.json).
    error(m.post("/models", params={"url": "../tiny.mar"}), 404, "ModelNotFound")
    error(m.post("/models", params={"url": "missing.mar"}), 404, "ModelNotFound")
    error(m.post("/models", content=b"{nope", headers={"content-type": "application/json"}),
          400, "BadRequest")  # fmt: skip
    error(m.put("/models/tiny", params={"min_worker": 3, "max_worker": 1}), 400, "BadRequest")
    error(m.put("/models/tiny", params={"min_worker": -1}), 400, "BadRequest")
    assert m.get("/models", params={"limit": "many"}).status_code == 200  # the default limit
    error(m.get("/models/nope"), 404, "ModelNotFound")
    error(m.get("/models/tiny/9.9"), 404, "ModelVersionNotFound")
    error(m.put("/models/tiny/9.9/set-default"), 404, "ModelVersionNotFound")
    error(m.delete("/models/nope"), 404, "ModelNotFound")
    error(m.delete("/models/tiny/9.9"), 404, "ModelVersionNotFound")
    error(m.get("/no/such/route"), 404, "NotFound")
    error(m.patch("/models"), 405, "MethodNotAllowed")

    described = m.request("OPTIONS", "/")
    assert described.status_code == 200
    paths = described.json()["paths"]
    assert {"/models", "/models/{name}", "/models/{name}/{version}/set-default"} <= set(paths)
    assert m.get("/openapi.json").json()["paths"] == paths

    assert m.delete("/models/tiny2").status_code == 200
    assert m.delete("/models/tiny").status_code == 200
    assert m.get("/models").json() == {"models": []}


@pytest.mark.parametrize("handler", ["../../h.py", "h.py:not a name", "a\\b.py", "/etc/passwd"])
def test_register_refuses_a_handler_outside_the_archive(live_server, handler, request):
    """Refused before any worker runs, with no worker as with one: ``..`` or a bad function
    name was registered (200) and the model's worker then failed to load (500)."""
    server = live_server(load_models=[], enable_model_api=True)
    m = httpx.Client(base_url=server.management_url, timeout=60)
    request.addfinalizer(m.close)
    for workers in (0, 1):
        params = {"url": "tiny.mar", "handler": handler, "initial_workers": workers}
        r = m.post("/models", params=params)
        assert r.status_code == 400, r.text
        assert r.json()["message"].startswith("handler must be a module or a file inside"), r.text
    assert m.get("/models").json() == {"models": []}


def test_register_refuses_a_model_directory_that_names_no_handler(live_server, request):
    """A folder without a manifest (``url=.``: the store itself) has no handler unless the call
    or ``default_service_handler`` gives one: a 400 at once, not a worker that fails (500)."""
    server = live_server(load_models=[], enable_model_api=True)
    m = httpx.Client(base_url=server.management_url, timeout=60)
    request.addfinalizer(m.close)
    for workers in (0, 1):
        params = {"url": ".", "model_name": "loose", "initial_workers": workers}
        r = m.post("/models", params=params)
        assert r.status_code == 400, r.text
        assert r.json()["message"].startswith("the model names no handler"), r.text
    assert m.get("/models").json() == {"models": []}


def test_register_json_body_is_bounded_by_max_request_size(live_server, request):
    # The body was read whole whatever its size (300 MB took 300 MB of the server's memory),
    # where TorchServe's max_request_size bounds every listener's request.
    server = live_server(enable_model_api=True, max_request_size=4096)
    m = httpx.Client(base_url=server.management_url, timeout=60)
    request.addfinalizer(m.close)
    json_type = {"content-type": "application/json"}
    big = b'{"url": "missing.mar"' + b" " * 8192 + b"}"

    def chunks():  # no Content-Length: the limit is found while reading
        yield big[:4000]
        yield big[4000:]

    for content in (big, chunks()):
        r = m.post("/models", content=content, headers=json_type)
        assert r.status_code == 413, r.text
        assert r.json()["type"] == "PayloadTooLarge" and "4096" in r.json()["message"]
    r = m.post("/models", content=b'{"url": "missing.mar"}', headers=json_type)
    assert r.status_code == 404 and r.json()["type"] == "ModelNotFound", r.text  # read, as before
    assert m.get("/models").json()["models"] == []


def test_model_api_off_by_default(live_server, request):
    server = live_server(load_models=[])
    m = httpx.Client(base_url=server.management_url, timeout=60)
    request.addfinalizer(m.close)
    for r in (m.post("/models", params={"url": "tiny.mar"}), m.delete("/models/tiny")):
        assert r.status_code == 405, r.text
        assert r.json()["type"] == "MethodNotAllowed"
        assert "enable-model-api" in r.json()["message"]
    assert m.get("/models").json() == {"models": []}
    # The other ports describe themselves too.
    for base in (server.url, server.metrics_url):
        doc = httpx.request("OPTIONS", f"{base}/")
        assert doc.status_code == 200 and doc.json()["openapi"].startswith("3.")
    assert "/predictions/{model_name}" in httpx.get(f"{server.url}/openapi.json").json()["paths"]
    assert "/metrics" in httpx.get(f"{server.metrics_url}/openapi.json").json()["paths"]


def test_out_of_range_nan_and_infinite_parameters_are_400_and_change_nothing(
    live_server, versioned_store, request
):
    server = live_server(model_store=versioned_store, enable_model_api=True)
    m = httpx.Client(base_url=server.management_url, timeout=60)
    request.addfinalizer(m.close)
    assert m.post("/models", params={"url": "tiny.mar", "initial_workers": 0}).status_code == 200
    [before] = m.get("/models/tiny").json()

    def refused(r: httpx.Response, *words: str) -> None:
        assert r.status_code == 400, r.text
        body = r.json()
        assert body["type"] == "BadRequest", body
        for word in words:
            assert word in body["message"], body

    big = 10**12  # register: "nan", "inf" are junk to TorchServe's parser (the default)
    # Register: the query string and a JSON body (NaN and 1e999 are what Python's json reads).
    for params, words in (
        ({"batch_size": 5000}, ("batch_size", "4096")),
        ({"max_batch_delay": 1e9}, ("max_batch_delay", "60000")),
        ({"initial_workers": big}, ("initial_workers", "512")),
        ({"response_timeout": 1e12}, ("response_timeout", "604800")),
        ({"startup_timeout": 1e12}, ("startup_timeout", "604800")),
    ):
        refused(m.post("/models", params={"url": "tiny.mar", "model_name": "t2", **params}), *words)
    for raw, words in (
        (b'{"url": "tiny.mar", "model_name": "t2", "initial_workers": 1000000000000}', ("512",)),
    ):
        r = m.post("/models", content=raw, headers={"content-type": "application/json"})
        refused(r, *words)
    assert [x["modelName"] for x in m.get("/models").json()["models"]] == ["tiny"]

    # Scale and tune, default version and an explicit one.
    for path in ("/models/tiny", "/models/tiny/1.0"):
        for params, words in (
            ({"min_worker": big}, ("min_worker", "512")),
            ({"min_worker": 1, "max_worker": big}, ("max_worker", "512")),
            ({"batch_size": 5000}, ("batch_size", "4096")),
            ({"max_batch_delay": "inf"}, ("max_batch_delay", "finite")),
            ({"max_batch_delay": "nan"}, ("max_batch_delay", "finite")),
            ({"max_batch_delay": 1e9}, ("max_batch_delay", "60000")),
            ({"response_timeout": "inf"}, ("response_timeout", "finite")),
            ({"response_timeout": 1e12}, ("response_timeout", "604800")),
            ({"min_worker": 0, "timeout": 1e12}, ("timeout",)),  # "inf": junk, the default
        ):
            refused(m.put(path, params={**params, "synchronous": True}), *words)
            refused(m.put(path, params=params), *words)  # asynchronous: checked before the 202
    [after] = m.get("/models/tiny").json()
    assert after == before
    # The server still works: an in-range change is applied.
    r = m.put("/models/tiny", params={"batch_size": 4096, "max_batch_delay": 60000})
    assert r.status_code == 202, r.text
    [tuned] = m.get("/models/tiny").json()
    assert (tuned["batchSize"], tuned["maxBatchDelay"]) == (4096, 60000)
