"""TorchServe's ``metrics_config`` and the three ``metrics_mode`` emitters, without a server:
what a config declares, the start-up errors of a bad one, TorchServe's log line format, and
which families each mode publishes on /metrics (the live comparison with TorchServe 0.12 is
test_metrics_modes.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchbay.server.config.metrics_config import load_metrics_config, parse_metrics_config
from torchbay.server.config.sources import load_server_config
from torchbay.server.errors import ConfigError
from torchbay.server.observe.ts_families import (
    MAX_SAMPLES,
    Family,
    MetricsLog,
    TsFamilies,
    java_double,
    metrics_options,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "torchserve" / "metrics_modes"
LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{3} - Requests2XX\.Count:1\.0\|#Level:Host"
    r"\|#hostname:h,timestamp:\d+$"
)


def test_the_default_is_torchserves_metrics_yaml() -> None:
    spec = load_metrics_config(None)
    assert list(spec.frontend)[:6] == [
        "Requests2XX",
        "Requests4XX",
        "Requests5XX",
        "ts_inference_requests_total",
        "ts_inference_latency_microseconds",
        "ts_queue_latency_microseconds",
    ]
    assert spec.frontend["WorkerLoadTime"].dimensions == ("WorkerName", "Level", "Hostname")
    handler = spec.model["HandlerTime"]  # model metrics get Hostname last, as TorchServe's
    assert (handler.kind, handler.unit, handler.dimensions) == (
        "gauge",
        "ms",
        ("ModelName", "Level", "Hostname"),
    )


def test_a_custom_config_drops_and_declares() -> None:
    spec = load_metrics_config(DATA / "custom_metrics.yaml")
    assert "Requests4XX" not in spec.frontend and "CPUUtilization" not in spec.frontend
    count = spec.model["InferenceCount"]
    assert (count.kind, count.dimensions) == (
        "counter",
        ("Color", "ModelName", "Level", "Hostname"),
    )


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("ts_metric:\n  counter: []\n", "'ts_metric'"),
        ("ts_metrics:\n  summary: []\n", "'summary'"),
        ("ts_metrics:\n  counter:\n    - {name: A, unit: Count, dims: [x]}\n", "'dims'"),
        ("model_metrics:\n  gauge:\n    - {unit: ms}\n", "without a name"),
        ("ts_metrics:\n  counter:\n    - {name: A, dimensions: [x, x]}\n", "distinct"),
        ("- a list\n", "a mapping"),
        ("ts_metrics: [\n", "not valid YAML"),
        ("dimensions: [a]\nts_metrics:\n  counter: [{name: A, dimensions: [*b]}]\n", "line 3"),
        ("ts_metrics: {\n  counter: [\n", "metrics_config: not valid YAML at line 3"),
        ("x: !!python/object/apply:os.system ['true']\n", "not valid YAML"),  # safe_load only
        ("[" * 5000, "nested too deep"),  # PyYAML recurses: no RecursionError escapes
    ],
)
def test_a_bad_config_is_an_error_naming_it(text: str, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_metrics_config(text)
    assert named in str(caught.value)
    assert str(caught.value).startswith("metrics_config")


def test_a_bad_metrics_config_stops_the_config_load(tmp_path: Path) -> None:
    (tmp_path / "metrics.yaml").write_text("ts_metrics:\n  counters: []\n")
    (tmp_path / "config.properties").write_text(
        "metrics_config=metrics.yaml\nmodel_metrics_auto_detect=true\nmetrics_mode=log\n"
    )
    with pytest.raises(ConfigError, match="unknown key 'counters'"):
        load_server_config(ts_config=None, env={}, cli={}, cwd=tmp_path)
    (tmp_path / "metrics.yaml").write_text((DATA / "custom_metrics.yaml").read_text())
    config, notes = load_server_config(ts_config=None, env={}, cli={}, cwd=tmp_path)
    assert config.metrics_config == tmp_path / "metrics.yaml"
    assert config.model_metrics_auto_detect and config.metrics_mode == "log"
    assert not any("ignored" in note for note in notes)  # both keys are used now


def test_prometheus_mode_refuses_a_name_prometheus_cannot_read(tmp_path: Path) -> None:
    """One such name would make every scraper refuse the whole /metrics page."""
    bad = {
        "model_metrics:\n  gauge:\n    - {name: my-metric, unit: ms}\n": "'my-metric'",
        "ts_metrics:\n  counter:\n    - {name: A, dimensions: [Model Name]}\n": "'Model Name'",
        "model_metrics:\n  counter:\n    - {name: A, dimensions: [Hostname]}\n": "twice",
    }
    for text, named in bad.items():
        (tmp_path / "metrics.yaml").write_text(text)
        for mode, refused in (("prometheus", True), ("log", False), ("legacy", False)):
            cli = {"metrics_config": "metrics.yaml", "metrics_mode": mode}
            if not refused:  # the log files take any name, as TorchServe's
                load_server_config(ts_config=None, env={}, cli=cli, cwd=tmp_path)
                continue
            with pytest.raises(ConfigError, match=named):
                load_server_config(ts_config=None, env={}, cli=cli, cwd=tmp_path)


def test_a_model_metric_named_as_a_host_metric_stops_the_config_load(tmp_path: Path) -> None:
    """The host collector publishes CPUUtilization while system metrics are on: a model metric
    of that name would be a second family of it on /metrics (Prometheus refuses the scrape)."""
    (tmp_path / "metrics.yaml").write_text(
        "model_metrics:\n  gauge:\n    - {name: CPUUtilization, dimensions: [ModelName]}\n"
    )
    cli = {"metrics_config": "metrics.yaml", "metrics_mode": "prometheus"}
    with pytest.raises(ConfigError, match="'CPUUtilization' is a host metric"):
        load_server_config(ts_config=None, env={}, cli=cli, cwd=tmp_path)
    for fine in ({"disable_system_metrics": "true"}, {"metrics_mode": "log"}):
        load_server_config(ts_config=None, env={}, cli={**cli, **fine}, cwd=tmp_path)


def test_java_double_as_torchserves_lines_write_it() -> None:
    values = (1, 0.26, 12296.056, 1e7, 0.0001, 123456789.5, 0)
    assert [java_double(v) for v in values] == [
        "1.0",
        "0.26",
        "12296.056",
        "1.0E7",
        "1.0E-4",
        "1.234567895E8",
        "0.0",
    ]


def test_modes_publish_as_torchserve(tmp_path: Path) -> None:
    spec = load_metrics_config(None)
    for mode, published in [
        ("prometheus", {"Requests2XX", "ts_inference_requests_total", "HandlerTime"}),
        ("legacy", {"ts_inference_requests_total"}),
        ("log", set()),
    ]:
        ts = TsFamilies(spec, mode, "h", None)
        ts.update("Requests2XX", ("Host", "h"), 1.0)
        ts.update("ts_inference_requests_total", ("m", "default", "h"), 1.0)
        ts.model_update("HandlerTime", "gauge", "ms", {"ModelName": "m", "Level": "Model"}, 2, "r")
        text = ts.text()
        assert {n for n in published if f"{n}{{" in text} == published, mode
        others = {"Requests2XX", "ts_inference_requests_total", "HandlerTime"} - published
        assert not any(f"{n}{{" in text for n in others), mode


def test_log_mode_writes_torchserves_lines(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path)
    ts = TsFamilies(load_metrics_config(None, auto_detect=True), "log", "h", log)
    ts.update("Requests2XX", ("Host", "h"), 1.0)
    ts.update("Requests2XX", ("Host",), 1.0)  # the wrong dimension count: dropped
    ts.model_update("HandlerTime", "gauge", "ms", {"ModelName": "m", "Level": "Model"}, 0.26, "a,b")
    assert (
        ts.model_records(
            [
                {
                    "name": "Seen",
                    "type": "counter",
                    "unit": "count",
                    "value": 2,
                    "dimensions": {"C": "x"},
                }
            ],
            "a",
        )
        == []
    )
    ts.close()
    (line,) = (tmp_path / "ts_metrics.log").read_text().splitlines()
    assert LINE.match(line), line
    model = [
        line.split(" - ", 1)[1]
        for line in (tmp_path / "model_metrics.log").read_text().splitlines()
    ]
    assert [re.sub(r"timestamp:\d+", "timestamp:T", m) for m in model] == [
        "HandlerTime.ms:0.26|#ModelName:m,Level:Model|#hostname:h,requestID:a,b,timestamp:T",
        "Seen.Count:2.0|#C:x|#hostname:h,requestID:a,timestamp:T",
    ]


def test_an_undeclared_handler_metric_is_left_to_torchbay_without_auto_detect() -> None:
    ts = TsFamilies(load_metrics_config(None), "prometheus", "h", None)
    record = {"name": "Seen", "type": "counter", "unit": "count", "value": 1, "dimensions": {}}
    assert ts.model_records([record], "r") == [record]
    assert "Seen" not in ts.text()


def test_a_configured_histogram_has_buckets() -> None:
    entry = "{name: QueueTime, unit: ms, dimensions: [Level, Hostname]}"
    spec = parse_metrics_config(f"ts_metrics:\n  histogram:\n    - {entry}\n")
    family = Family(spec.frontend["QueueTime"], None)
    for value in (0.004, 0.3, 20):
        family.update(("Host", "h"), value)
    text = "\n".join(family.text())
    assert "# TYPE QueueTime histogram" in text
    assert 'QueueTime_bucket{Level="Host",Hostname="h",le="0.005",} 1.0' in text
    assert 'QueueTime_bucket{Level="Host",Hostname="h",le="0.5",} 2.0' in text
    assert 'QueueTime_bucket{Level="Host",Hostname="h",le="+Inf",} 3.0' in text
    assert 'QueueTime_count{Level="Host",Hostname="h",} 3.0' in text


def test_a_family_keeps_a_bounded_number_of_label_sets() -> None:
    family = Family(load_metrics_config(None).frontend["WorkerLoadTime"], None)
    for worker in range(MAX_SAMPLES + 5):  # recycled workers: a new name each
        family.update((f"W-{worker}-m_1.0", "Host", "h"), 1.0)
    assert len(family.samples) == MAX_SAMPLES
    assert ("W-0-m_1.0", "Host", "h") not in family.samples  # the oldest went first
    assert (f"W-{MAX_SAMPLES + 4}-m_1.0", "Host", "h") in family.samples


def test_the_log_files_follow_metrics_location_and_survive_an_unwritable_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from types import SimpleNamespace

    config = SimpleNamespace(
        metrics_config=None,
        model_metrics_auto_detect=False,
        disable_system_metrics=False,
        log_file_max_bytes=1 << 20,
        log_file_backups=2,
    )
    prometheus = metrics_options(SimpleNamespace(**vars(config), metrics_mode="prometheus"), {})
    assert prometheus["metrics_log"] is None  # no file is opened in prometheus mode
    logged = SimpleNamespace(**vars(config), metrics_mode="log")
    options = metrics_options(
        logged, {"METRICS_LOCATION": str(tmp_path / "m"), "LOG_LOCATION": "x"}
    )
    options["metrics_log"].close()
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == [
        "model_metrics.log",
        "ts_metrics.log",
    ]
    (tmp_path / "file").write_text("not a directory")
    options = metrics_options(logged, {"LOG_LOCATION": str(tmp_path / "file")})
    assert options["metrics_log"] is None and options["mode"] == "log"
    assert "cannot write metrics logs" in caplog.text


@pytest.mark.parametrize(
    ("metric", "named"),
    [
        ("{name: my metric, unit: Count, dimensions: [Color]}", "'my metric'"),
        ("{name: Inferences, unit: Count, dimensions: [bad-dim]}", "'bad-dim'"),
        ("{name: Inferences, unit: Count, dimensions: [__reserved]}", "'__reserved'"),
        ("{name: QueueTime, unit: Count, dimensions: [Level]}", "'QueueTime' is a ts_metrics"),
    ],
)
def test_a_name_prometheus_cannot_write_stops_the_config_load_when_published(
    tmp_path: Path, metric: str, named: str
) -> None:
    """A family that would make every scrape unparseable: an error in prometheus mode, fine where
    it is only logged (TorchServe's log lines take any name)."""
    frontend = "ts_metrics:\n  gauge:\n    - {name: QueueTime, unit: ms, dimensions: [Level]}\n"
    model = f"model_metrics:\n  counter:\n    - {metric}\n"
    (tmp_path / "metrics.yaml").write_text(frontend + model)
    for mode in ("log", "legacy", "prometheus"):
        (tmp_path / "config.properties").write_text(
            f"metrics_config=metrics.yaml\nmetrics_mode={mode}\n"
        )
        if mode != "prometheus":
            load_server_config(ts_config=None, env={}, cli={}, cwd=tmp_path)
            continue
        with pytest.raises(ConfigError, match=re.escape(named)):
            load_server_config(ts_config=None, env={}, cli={}, cwd=tmp_path)
