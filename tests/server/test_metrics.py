"""Metrics on a live server, scraped and parsed with prometheus_client's own parser.

One server for the module (three models: ``probe`` batching up to 4, ``slow`` the same archive
with a queue of one, ``metric`` recording custom metrics); every test measures deltas between
two scrapes, so tests do not depend on each other's traffic.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from torchbay.archiver.package import ArchiveOptions, package
from torchbay.server.observe import retired
from torchbay.server.observe.custom_metrics import CustomMetrics, label_name, metric_name
from torchbay.server.observe.metrics import ServerMetrics
from torchbay.server.observe.system_metrics import GPU_METRICS, HOST_METRICS, load_nvml
from torchbay.server.observe.ts_metrics import ts_text
from torchbay.server.serving.batches import BatchRecord
from torchbay.server.serving.model import ModelSettings, ModelVersion
from torchbay.server.serving.slot import Placement

from .conftest import ASSETS, LiveServer, _tiny_model, make_config

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "torchbay.json"

# -- fixtures and helpers ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(model_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    work = tmp_path_factory.mktemp("metric-build")
    package(
        ArchiveOptions(
            model_name="metric",
            version="1.0",
            serialized_file=_tiny_model(work / "model.pt"),
            handler=str(ASSETS / "metric_handler.py"),
            export_path=model_store,
        )
    )
    models = {
        "probe": {"1.0": {"marName": "probe.mar", "batchSize": 4, "maxBatchDelay": 300}},
        "slow": {"1.0": {"marName": "probe.mar", "batchSize": 1, "jobQueueSize": 1}},
        "metric": {"1.0": {"marName": "metric.mar"}},
    }
    live = LiveServer(make_config(model_store, models=models)).start()
    assert not live.server.state.failed_models
    yield live
    live.stop()


class Scrape:
    """One parsed /metrics page: ``value(name, **labels)`` sums matching samples."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        # The parser appends _total to a counter's samples; TorchServe's (Requests2XX) have none.
        written = set(re.findall(r"^([A-Za-z_:][A-Za-z0-9_:]*)[{ ]", text, re.M))
        self.samples = [
            s._replace(name=s.name[: -len("_total")])
            if s.name not in written and s.name.endswith("_total")
            else s
            for f in self.families.values()
            for s in f.samples
        ]
        self.sample_names = {s.name for s in self.samples}

    def value(self, name: str, **labels: str) -> float:
        return sum(
            s.value
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    def series(self, name: str, **labels: str) -> list[Any]:
        return [
            s
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]


def scrape(server: LiveServer) -> Scrape:
    r = httpx.get(f"{server.metrics_url}/metrics", timeout=30)
    assert r.status_code == 200
    return Scrape(r.text)


async def ascrape(client: httpx.AsyncClient, server: LiveServer) -> Scrape:
    r = await client.get(f"{server.metrics_url}/metrics")
    return Scrape(r.text)


async def wait_for(
    client: httpx.AsyncClient, server: LiveServer, model: str, **gauges: int
) -> None:
    """Poll the server's own gauges until they read ``gauges`` (10 s at most)."""
    for _ in range(1000):
        page = await ascrape(client, server)
        if all(page.value(f"torchbay_{g}", model=model) == v for g, v in gauges.items()):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{model} never reached {gauges}")


def _delta(after: Scrape, before: Scrape, name: str, **labels: str) -> float:
    return after.value(name, **labels) - before.value(name, **labels)


# -- live server ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_exact_counts_for_each_outcome(server: LiveServer, tmp_path: Path) -> None:
    url = server.url
    before = scrape(server)
    polls: list[int] = []  # wait_for's scrapes: TorchServe counts the metrics listener's answers

    async def seen(response: httpx.Response) -> None:
        if str(response.url).startswith(server.metrics_url):
            polls.append(response.status_code)

    async def scenario() -> list[int]:
        async with httpx.AsyncClient(timeout=60, event_hooks={"response": [seen]}) as client:
            codes = []
            for path in ("probe", "probe", "probe/1.0"):
                codes.append((await client.post(f"{url}/predictions/{path}", json={})).status_code)
            for _ in range(2):
                r = await client.post(f"{url}/predictions/probe", json={"bad": True})
                codes.append(r.status_code)
            for _ in range(2):
                codes.append((await client.post(f"{url}/predictions/nope", json={})).status_code)
            # slow: one request running (held until the gate file exists, then 1 s more), one
            # queued (capacity 1), then two refused at once; no window a loaded host can miss.
            gate = tmp_path / "gate"
            body = {"sleep": 1.0, "until": str(gate)}
            running = asyncio.ensure_future(client.post(f"{url}/predictions/slow", json=body))
            await wait_for(client, server, "slow", inflight_requests=1, queue_depth=0)
            queued = asyncio.ensure_future(client.post(f"{url}/predictions/slow", json={}))
            await wait_for(client, server, "slow", queue_depth=1)
            for _ in range(2):
                codes.append((await client.post(f"{url}/predictions/slow", json={})).status_code)
            gate.touch()
            codes += [(await running).status_code, (await queued).status_code]
            return codes

    codes = asyncio.run(scenario())
    assert codes == [200, 200, 200, 400, 400, 404, 404, 503, 503, 200, 200]
    after = scrape(server)
    d = lambda name, **labels: _delta(after, before, name, **labels)  # noqa: E731
    probe = {"model": "probe", "version": "1.0"}
    slow = {"model": "slow", "version": "1.0"}
    assert d("torchbay_requests_total", code="200", **probe) == 3
    assert d("torchbay_requests_total", code="400", **probe) == 2
    assert d("torchbay_requests_total", code="200", **slow) == 2
    assert d("torchbay_requests_total", code="503", **slow) == 2
    # Unknown models have no per-model series (their names come from the URL).
    assert not after.series("torchbay_requests_total", model="nope")
    assert d("torchbay_unrouted_requests_total", code="404") == 2
    # 2XX: the five answered, the ``before`` scrape and wait_for's polls (a scrape is counted
    # after its body is written, as TorchServe does, so ``after`` does not count itself).
    assert polls and set(polls) == {200}
    assert d("Requests2XX") == 5 + 1 + len(polls)
    assert d("Requests4XX") == 4 and d("Requests5XX") == 2
    # Histograms count the requests a worker took: not the two refused at admission.
    for hist in ("torchbay_request_latency_seconds", "torchbay_queue_latency_seconds"):
        assert d(f"{hist}_count", **probe) == 5
        assert d(f"{hist}_count", **slow) == 2
        assert d(f"{hist}_bucket", le="+Inf", **probe) == 5
    assert d("torchbay_request_latency_seconds_sum", **slow) >= 1.0  # the sleeping one
    # TorchServe's names: version "default" when the URL named none.
    ts = {"model_name": "probe", "hostname": socket.gethostname()}
    assert d("ts_inference_requests_total", model_version="default", **ts) == 4
    assert d("ts_inference_requests_total", model_version="1.0", **ts) == 1
    assert d("ts_inference_requests_total", model_name="slow", model_version="default") == 4
    assert d("ts_inference_latency_microseconds", model_name="slow") >= 1e6
    assert d("ts_queue_latency_microseconds", model_name="slow") > 0  # the queued one waited
    assert after.value("torchbay_queue_depth", **slow) == 0
    assert after.value("torchbay_inflight_requests", **slow) == 0


@pytest.mark.slow
def test_batch_size_histogram_matches_the_batches_the_handler_saw(server: LiveServer) -> None:
    before = scrape(server)

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            posts = [
                client.post(f"{server.url}/predictions/probe", json={"echo": i}) for i in range(10)
            ]
            return await asyncio.gather(*posts)

    responses = asyncio.run(burst())
    assert all(r.status_code == 200 for r in responses)
    sizes = Counter(r.json()["batch_in"] for r in responses)  # requests seen per batch size
    batches = {size: n // size for size, n in sizes.items()}
    assert all(n % size == 0 for size, n in sizes.items())
    after = scrape(server)
    labels = {"model": "probe", "version": "1.0"}
    assert _delta(after, before, "torchbay_batch_size_count", **labels) == sum(batches.values())
    assert _delta(after, before, "torchbay_batch_size_sum", **labels) == 10
    for le in (1, 2, 4):
        expected = sum(n for size, n in batches.items() if size <= le)
        assert (
            _delta(after, before, "torchbay_batch_size_bucket", le=f"{le:.1f}", **labels)
            == expected
        )
    for stage in ("preprocess", "inference", "postprocess", "handler"):
        got = _delta(after, before, "torchbay_handler_seconds_count", stage=stage, **labels)
        assert got == sum(batches.values()), stage


@pytest.mark.slow
def test_custom_handler_metrics_with_their_labels(server: LiveServer) -> None:
    url = f"{server.url}/predictions/metric"
    first = [
        {"name": "ProbeItems", "value": 2, "dims": {"Source": "probe"}},
        {"name": "probe latency.ms", "value": 12.5, "type": "gauge", "unit": "ms"},
        {"name": "ProbeSizes", "value": 3, "type": "histogram"},
    ]
    assert httpx.post(url, json={"metrics": first}, timeout=60).status_code == 200
    page = scrape(server)
    labels = {"model": "metric", "version": "1.0", "ModelName": "metric", "Level": "Model"}
    assert page.value("ProbeItems_total", Source="probe", **labels) == 2
    assert page.families["probe_latency_ms"].type == "gauge"
    assert page.value("probe_latency_ms", **labels) == 12.5
    assert page.value("ProbeSizes_count", **labels) == 1
    assert page.value("ProbeSizes_sum", **labels) == 3
    # Records the server cannot take are dropped; the request and the server are unharmed.
    bad = [
        {"name": "ProbeItems", "value": 1, "dims": {"Other": "x"}},  # another label set
        {"name": "ProbeItems", "value": 1, "type": "gauge", "dims": {"Source": "probe"}},
        {"name": "ProbeItems", "value": -1, "dims": {"Source": "probe"}},  # counters only go up
        {"name": "torchbay_requests", "value": 1},  # a server metric's name
    ]
    assert httpx.post(url, json={"metrics": bad}, timeout=60).status_code == 200
    good = [{"name": "ProbeItems", "value": 1, "dims": {"Source": "probe"}}]
    assert httpx.post(url, json={"metrics": good}, timeout=60).status_code == 200
    after = scrape(server)
    assert after.value("ProbeItems_total", Source="probe", **labels) == 3
    assert not after.series("ProbeItems_total", Other="x")
    codes = {s.labels["code"] for s in after.series("torchbay_requests_total", model="metric")}
    assert codes == {"200"}


@pytest.mark.slow
def test_torchserve_named_series(server: LiveServer) -> None:
    assert httpx.post(f"{server.url}/predictions/probe", json={}, timeout=60).status_code == 200
    page = scrape(server)
    host = {"Level": "Host", "Hostname": socket.gethostname()}
    assert page.series("Requests2XX")  # a class has a sample once one answer was counted
    for cls in ("2", "4", "5"):
        for sample in page.series(f"Requests{cls}XX"):
            assert sample.labels == host
    for name in ("ts_inference_latency_microseconds", "ts_queue_latency_microseconds"):
        assert page.series(name, model_name="probe")  # exact names, no _total appended
        assert set(page.series(name)[0].labels) == {"model_name", "model_version", "hostname"}
    (requests,) = page.series(
        "ts_inference_requests_total", model_name="probe", model_version="default"
    )
    assert set(requests.labels) == {"model_name", "model_version", "hostname"}
    assert page.series("QueueTime", **host) and page.series("WorkerThreadTime", **host)
    loads = page.series("WorkerLoadTime", Level="Host")
    assert {s.labels["WorkerName"].rsplit("-", 1)[1] for s in loads} >= {"probe_1.0", "slow_1.0"}
    assert all(s.value > 0 for s in loads)


@pytest.mark.slow
def test_model_state_is_read_at_scrape_time(server: LiveServer) -> None:
    page = scrape(server)
    for model in ("probe", "slow", "metric"):
        labels = {"model": model, "version": "1.0"}
        assert page.value("torchbay_workers", state="READY", **labels) == 1
        states = {s.labels["state"] for s in page.series("torchbay_workers", **labels)}
        assert states == {"STARTING", "READY", "BUSY", "DRAINING", "STOPPED", "FAILED"}
        assert page.series("torchbay_queue_depth", **labels)
        assert page.series("torchbay_inflight_requests", **labels)
        assert page.value("torchbay_model_ready", **labels) == 1
        assert page.value("torchbay_model_load_seconds", **labels) > 0
        assert page.series("torchbay_worker_restarts_total", **labels)  # exists at 0


@pytest.mark.slow
def test_host_metrics(server: LiveServer) -> None:
    page = scrape(server)
    host = {"Level": "Host", "Hostname": socket.gethostname()}
    for name in HOST_METRICS:
        (sample,) = page.series(name, **host)
        assert sample.value >= 0, name
    assert 0 < page.value("MemoryUtilization") <= 100
    assert page.value("MemoryAvailable") > 0


@pytest.mark.slow
def test_metrics_filter_by_name(server: LiveServer) -> None:
    # name[] keeps samples (TorchServe's filter): both families have one once a request was served
    assert httpx.post(f"{server.url}/predictions/probe", json={}, timeout=60).status_code == 200
    r = httpx.get(
        f"{server.metrics_url}/metrics",
        params=[("name[]", "ts_inference_requests_total"), ("name[]", "Requests2XX")],
    )
    names = {f.name for f in text_string_to_metric_families(r.text)}
    assert names == {"ts_inference_requests", "Requests2XX"}


# -- the Grafana dashboard ------------------------------------------------------------------------

_PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "bool", "offset", "inf", "nan",
}  # fmt: skip


def promql_metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: identifiers that are not functions, keywords, labels."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings ("$model", "4..|5..")
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for m in re.finditer(r"(?<![\w$.])([a-zA-Z_:][\w:]*)(\s*\()?", expr):
        word, call = m.group(1), m.group(2)
        if not call and word.lower() not in _PROMQL_WORDS:
            names.add(word)
    return names


def dashboard_queries() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = []
    stack = list(dash["panels"])
    while stack:
        panel = stack.pop()
        stack.extend(panel.get("panels", []))
        exprs += [t["expr"] for t in panel.get("targets", [])]
    for var in dash["templating"]["list"]:
        query = var.get("query")
        query = query.get("query", "") if isinstance(query, dict) else query or ""
        m = re.fullmatch(r"label_values\((\w+),\s*\w+\)", query)
        if m:
            exprs.append(m.group(1))
    return exprs


def test_promql_name_extraction() -> None:
    expr = (
        'histogram_quantile(0.9, sum by (le, model) (rate(a_bucket{model=~"$model"}'
        "[$__rate_interval]))) / ignoring(x) b + on(y) CPUUtilization offset 5m"
    )
    assert promql_metric_names(expr) == {"a_bucket", "b", "CPUUtilization"}


@pytest.mark.slow
def test_dashboard_queries_only_metrics_that_exist(server: LiveServer) -> None:
    exprs = dashboard_queries()
    names = set().union(*(promql_metric_names(e) for e in exprs))
    assert len(exprs) >= 20 and "torchbay_request_latency_seconds_bucket" in names
    assert any("histogram_quantile(0.99" in e for e in exprs)
    # Traffic of every kind the dashboard charts, so every series exists.
    assert httpx.post(f"{server.url}/predictions/probe", json={}, timeout=60).status_code == 200
    assert httpx.post(f"{server.url}/predictions/nope", json={}).status_code == 404
    page = scrape(server)
    # GPU series exist only with NVML and a GPU (see test_gpu_metrics_per_device_through_nvml);
    # TorchServe's Requests5XX is declared before its first sample (no 5xx answer yet when this
    # test runs alone), as TorchServe declares it.
    served = page.sample_names | {n for n, f in page.families.items() if not f.samples}
    missing = {n for n in names if n not in served and n not in GPU_METRICS}
    assert not missing, f"the dashboard queries metrics the server does not serve: {missing}"


# -- units ----------------------------------------------------------------------------------------


def _model(name: str = "m", version: str = "1.0") -> ModelVersion:
    return ModelVersion(
        name=name,
        version=version,
        model_dir=Path("."),
        settings=ModelSettings(),
        place=lambda mv, i: Placement(gpu_id=None, threads=1),
    )


def _page(registry: CollectorRegistry) -> Scrape:
    return Scrape(generate_latest(registry).decode())


def test_sanitized_names() -> None:
    assert metric_name("probe latency.ms") == "probe_latency_ms"
    assert metric_name("9lives") == "_9lives"
    assert metric_name("a:b") == "a:b"
    assert label_name("Model Name") == "Model_Name"
    assert label_name("__x") == "x__x"
    assert label_name("model") == "exported_model"
    assert label_name("9") == "_9"


def test_custom_metrics_are_capped_and_never_raise(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    custom = CustomMetrics(registry, max_metrics=3, max_series=2)
    mv = _model()
    records: list[Any] = [
        {"name": f"m{i}", "type": "counter", "value": 1, "dimensions": {}} for i in range(5)
    ]
    records += [
        {"name": "m0", "type": "counter", "value": 1, "dimensions": {"k": str(i)}} for i in range(2)
    ]
    records += ["not a dict", {"value": 1}, {"name": "m1", "value": "x"}]
    records += [{"name": "m2", "value": 1, "dimensions": {"a": "1"}}]  # m2 has no dims
    records += [{"name": "m1", "type": "summary", "value": 1, "dimensions": {}}]
    custom.record(mv, records)
    custom.record(mv, records)  # the same again: still no exception, no new metrics
    page = _page(registry)
    assert {n for n in page.families if n.startswith("m")} == {"m0", "m1", "m2"}
    assert page.value("m0_total") == 2
    # Label sets per metric are capped too.
    gauges = [
        {"name": "g", "type": "gauge", "value": i, "dimensions": {"k": str(i)}} for i in range(5)
    ]
    custom = CustomMetrics(CollectorRegistry(), max_series=2)
    custom.record(mv, gauges)
    assert len(custom._metrics["g"].children) == 2  # type: ignore[union-attr]
    warnings = [r for r in caplog.records if r.name == "torchbay.metrics"]
    assert warnings and len(warnings) == len({r.getMessage() for r in warnings})  # logged once


def test_a_nan_or_infinite_custom_value_is_dropped_whatever_its_type() -> None:
    """TorchServe's frontend cannot parse ``nan`` or ``inf``: no family gets them. A gauge's
    NaN or Inf was published (``g NaN``), and the gauge lost its last finite value."""
    registry = CollectorRegistry()
    custom = CustomMetrics(registry)
    records = [{"name": "g", "type": "gauge", "value": 3, "dimensions": {}}]
    records += [
        {"name": name, "type": kind, "value": value, "dimensions": {}}
        for name, kind in (("g", "gauge"), ("h", "histogram"), ("c", "counter"))
        for value in (float("nan"), float("inf"), float("-inf"))
    ]
    custom.record(_model(), records)
    page = _page(registry)
    assert [(s.name, s.value) for s in page.series("g")] == [("g", 3.0)]
    assert page.series("h_count") == page.series("c_total") == []


def test_a_new_versions_custom_series_is_kept_past_the_cap() -> None:
    """Versions come and go (each registration a new label set): past ``max_series``, the
    oldest label set makes room, and the version serving now keeps being published."""
    registry = CollectorRegistry()
    custom = CustomMetrics(registry, max_series=3)
    record = {"name": "hits", "type": "counter", "value": 1, "dimensions": {}}
    for version in range(1, 6):
        custom.record(_model(version=f"{version}.0"), [record, record])
    page = _page(registry)
    assert page.value("hits_total", model="m", version="5.0") == 2
    assert [s.labels["version"] for s in page.series("hits_total")] == ["3.0", "4.0", "5.0"]


def test_the_custom_series_of_versions_gone_go_with_their_own_series() -> None:
    """Versions recorded by a handler's metric, then gone (a multi-model endpoint's churn): the
    metric's series of the older versions gone go with their torchbay_* series (the KEEP most
    recently used stay, observe.retired). Before, they stayed up to max_series per metric: each
    of 100 handler metrics could hold 1000 label sets of versions long unregistered."""
    metrics = ServerMetrics(hostname="h", system_metrics=False)  # watches no registry: all gone
    hits = {"name": "hits", "type": "counter", "unit": "", "value": 1, "dimensions": {}}
    for i in range(retired.KEEP + 3):
        batch = BatchRecord(size=1, queue_times_s=[0.0], timings_ms={}, metrics=[dict(hits)])
        metrics.batch_done(_model(version=str(i)), batch)
    page = _page(metrics.registry)
    kept = {str(i) for i in range(3, retired.KEEP + 3)}
    assert {s.labels["version"] for s in page.series("torchbay_batch_size_count")} == kept
    assert {s.labels["version"] for s in page.series("hits_total")} == kept
    metrics.batch_done(_model(version="0"), batch)  # back: its series start again
    assert _page(metrics.registry).value("hits_total", version="0") == 1


def test_system_metrics_can_be_disabled() -> None:
    on = _page(ServerMetrics(hostname="h", nvml=None).registry)
    off = _page(ServerMetrics(hostname="h", system_metrics=False).registry)
    assert all(on.series(name, Level="Host", Hostname="h") for name in HOST_METRICS)
    assert not any(name in off.families for name in HOST_METRICS)
    assert "Requests2XX" in ts_text(ServerMetrics(hostname="h", system_metrics=False))


class FakeNvml:
    """An NVML-shaped I/O seam: two devices, the second unreadable."""

    def __init__(self) -> None:
        self.shut = False

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        if handle == 1:
            raise OSError("GPU fell off the bus")
        return SimpleNamespace(gpu=37, memory=5)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(used=512 * 1024 * 1024, total=2048 * 1024 * 1024)

    def nvmlShutdown(self) -> None:
        self.shut = True


def test_gpu_metrics_per_device_through_nvml() -> None:
    nvml = FakeNvml()
    metrics = ServerMetrics(hostname="h", nvml=nvml)
    page = _page(metrics.registry)
    labels = {"Level": "Host", "DeviceId": "0", "Hostname": "h"}
    assert page.value("GPUUtilization", **labels) == 37
    assert page.value("GPUMemoryUtilization", **labels) == 25
    assert page.value("GPUMemoryUsed", **labels) == 512
    assert not page.series("GPUUtilization", DeviceId="1")
    metrics.close()
    assert nvml.shut


def test_no_gpu_series_without_nvml_or_devices() -> None:
    class NoDevices(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            return 0

    page = _page(ServerMetrics(hostname="h", nvml=NoDevices()).registry)
    assert "GPUUtilization" not in page.families
    try:
        import pynvml  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        assert load_nvml() is None
