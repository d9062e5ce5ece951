"""The compose stack's wiring (Prometheus scrapes torchbay's metrics port, Grafana gets the
datasource and the dashboard) and, against a running server started by the image's entrypoint,
that every metric name deploy/ refers to (dashboard, HPA, adapter, KEDA) is exported."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from .conftest import DEPLOY, ROOT, SAMPLE

COMPOSE = DEPLOY / "compose"
DASHBOARD = DEPLOY / "grafana" / "torchbay.json"
_PROMQL_WORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "offset", "bool"}
_PROMQL_WORDS |= {"group_left", "group_right", "inf", "nan"}


def compose() -> dict[str, Any]:
    return yaml.safe_load((COMPOSE / "compose.yaml").read_text())


def image_properties() -> dict[str, str]:
    text = (DEPLOY / "docker" / "config.properties").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if line and line[0] != "#")


def test_prometheus_scrapes_the_metrics_port() -> None:
    services = compose()["services"]
    env = services["torchbay"].get("environment", {})
    port = int(
        env.get("TORCHBAY_METRICS_PORT") or urlsplit(image_properties()["metrics_address"]).port
    )
    prom = yaml.safe_load((COMPOSE / "prometheus" / "prometheus.yml").read_text())
    (job,) = prom["scrape_configs"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    (target,) = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert target == f"torchbay:{port}"
    assert urlsplit(image_properties()["metrics_address"]).port == port
    mounted = services["prometheus"]["volumes"][0].split(":")
    assert (COMPOSE / mounted[0]).resolve() == (COMPOSE / "prometheus" / "prometheus.yml")
    assert mounted[1] in services["prometheus"]["command"][0]


def test_grafana_is_provisioned() -> None:
    services = compose()["services"]
    grafana = services["grafana"]
    mounts = dict(v.rsplit(":", 1)[0].split(":") for v in grafana["volumes"])
    assert (COMPOSE / "../grafana/torchbay.json").resolve() == DASHBOARD.resolve()
    dashboard_path = mounts["../grafana/torchbay.json"]
    provisioning = COMPOSE / "grafana" / "provisioning"
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "torchbay.yaml").read_text())[
        "providers"
    ]
    assert str(Path(dashboard_path).parent) == provider["options"]["path"]
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())[
        "datasources"
    ]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    assert source["url"] == "http://prometheus:9090" and "prometheus" in services
    variables = json.loads(DASHBOARD.read_text())["templating"]["list"]
    assert any(v.get("type") == "datasource" and v.get("query") == "prometheus" for v in variables)


def promql_metric_names(expr: str) -> set[str]:
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for m in re.finditer(r"(?<![\w$.])([a-zA-Z_:][\w:]*)(\s*\()?", expr):
        if not m.group(2) and m.group(1).lower() not in _PROMQL_WORDS:
            names.add(m.group(1))
    return names


def dashboard_names() -> set[str]:
    dash = json.loads(DASHBOARD.read_text())
    stack, names = list(dash["panels"]), set()
    while stack:
        panel = stack.pop()
        stack.extend(panel.get("panels", []))
        for target in panel.get("targets", []):
            names |= promql_metric_names(target["expr"])
    return names


def referenced_torchbay_metrics() -> dict[str, set[str]]:
    """Every torchbay_* metric name in deploy/'s YAML (HPA, adapter rules, KEDA, ...)."""
    found: dict[str, set[str]] = {}
    for path in DEPLOY.rglob("*.yaml"):
        for name in re.findall(r"\btorchbay_[a-z_]+\b", path.read_text()):
            found.setdefault(name, set()).add(str(path.relative_to(DEPLOY)))
    return found


@pytest.mark.slow
def test_metric_names_exist_on_a_running_server(image_server: Any) -> None:
    """The server the image runs (see the image_server fixture), after some traffic."""
    _, ports, keys = image_server
    base = f"http://127.0.0.1:{ports['inference']}"
    auth = {"Authorization": f"Bearer {keys['inference']['key']}"}
    ok = httpx.post(f"{base}/predictions/mnist", json=SAMPLE, headers=auth, timeout=30)
    assert ok.status_code == 200
    missing = httpx.post(f"{base}/predictions/nope", json=SAMPLE, headers=auth, timeout=30)
    assert missing.status_code == 404
    page = httpx.get(f"http://127.0.0.1:{ports['metrics']}/metrics", timeout=30).text
    exported = {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][\w:]*)[{ ]", page, re.M)}
    # A family declared without a sample yet (TorchServe's Requests5XX before any 5xx answer, as
    # TorchServe writes it) is exported too: the dashboard's query finds it once it counts.
    exported |= {m.group(1) for m in re.finditer(r"^# TYPE ([a-zA-Z_:][\w:]*) ", page, re.M)}
    # A family's name also covers its samples' suffixes (torchbay_requests -> _total).
    families = {re.sub(r"_(bucket|sum|count|total|created)$", "", n) for n in exported}
    referenced = referenced_torchbay_metrics()
    assert {"torchbay_inflight_requests", "torchbay_queue_depth"} <= set(referenced)
    missing = {n: where for n, where in referenced.items() if n not in exported | families}
    assert not missing, f"deploy/ names metrics the server does not export: {missing}"
    names = dashboard_names()
    assert len(names) >= 5
    # GPU gauges exist only where NVML sees a GPU: on this host, check the server declares them.
    gpu = {n for n in names if n.startswith("GPU")}
    declared = (ROOT / "server" / "observe" / "system_metrics.py").read_text()
    assert all(f'"{n}"' in declared for n in gpu), gpu
    assert not names - exported - gpu, f"dashboard metrics not exported: {names - exported}"
