"""The image's entrypoint, run on the host against the two layouts the image serves:

* KServe's: ``<root>/config/config.properties`` (the config KServe's docs give for TorchServe:
  ``model_snapshot``, inference and management on ONE address) + ``<root>/model-store/``;
* TorchServe's image: ``<home>/config.properties`` (the image's own) + ``<home>/model-store/``.

Each answers ``/v2/health/ready``, an OIP infer, a TorchServe predict and a KServe v1 predict,
and stops cleanly on SIGTERM (exit 0).
"""

from __future__ import annotations

import re
import shutil
import socket
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from .conftest import DEPLOY, GRPC_ON_FREE_PORTS, SAMPLE, free_port

pytestmark = pytest.mark.slow


def _exercise(base: str, headers: dict[str, str] | None = None) -> None:
    with httpx.Client(base_url=base, timeout=30, headers=headers or {}) as client:
        ready = client.get("/v2/health/ready")
        assert ready.status_code == 200, ready.text
        assert ready.json() == {"ready": True}
        oip = client.post(
            "/v2/models/mnist/infer",
            json={"inputs": [{"name": "input0", "shape": [1, 64], "datatype": "FP32",
                              "data": SAMPLE}]},
        )  # fmt: skip
        assert oip.status_code == 200, oip.text
        outputs = oip.json()["outputs"]
        assert outputs[0]["shape"] == [1, 10]
        predict = client.post("/predictions/mnist", json=SAMPLE)
        assert predict.status_code == 200, predict.text
        expected = predict.json()["output"]
        assert len(expected) == 10
        v1 = client.post("/v1/models/mnist:predict", json={"instances": [SAMPLE, SAMPLE]})
        assert v1.status_code == 200, v1.text
        predictions = v1.json()["predictions"]
        assert predictions == [predict.json(), predict.json()]
        assert outputs[0]["data"] == pytest.approx(expected, rel=1e-5)


def test_kserve_layout(archive: Path, container: Any, tmp_path: Path) -> None:
    """KServe's config unchanged but for loopback and free ports: one listener for inference
    and management, the model named only in model_snapshot."""
    root = tmp_path / "mnt-models"
    (root / "config").mkdir(parents=True)
    (root / "model-store").mkdir()
    shutil.copy(archive, root / "model-store" / "mnist.mar")
    port = free_port()
    text = (DEPLOY / "kserve" / "config" / "config.properties").read_text()
    assert "\nload_models" not in text and "\nmodel_snapshot=" in text
    text = text.replace("0.0.0.0:8085", f"127.0.0.1:{port}")
    text = text.replace("0.0.0.0:8082", "127.0.0.1:0")
    (root / "config" / "config.properties").write_text(text)
    run = container(
        {
            "TORCHBAY_KSERVE_ROOT": str(root),
            "TORCHBAY_HOME": str(tmp_path / "no-home"),
            # As the ClusterServingRuntime sets it (auth sits in front of KServe).
            "TORCHBAY_DISABLE_TOKEN_AUTHORIZATION": "true",
            **GRPC_ON_FREE_PORTS,
        },
        tmp_path,
    )
    ports = run.wait_ready()
    assert ports["inference"] == ports["management"] == port
    assert ports["failed_models"] == {}
    base = f"http://127.0.0.1:{port}"
    _exercise(base)
    with httpx.Client(base_url=base, timeout=30) as client:
        # The management API answers on the same port: the snapshot's settings took effect.
        described = client.get("/models/mnist")
        assert described.status_code == 200, described.text
        assert described.json()[0]["maxWorkers"] == 5
        assert client.get("/v1/models/mnist").json() == {"name": "mnist", "ready": True}
        metrics = httpx.get(f"http://127.0.0.1:{ports['metrics']}/metrics", timeout=30)
        assert 'torchbay_model_ready{model="mnist"' in metrics.text
    assert run.stop() == 0, run.output()


def test_torchserve_layout(image_server: Any) -> None:
    """The image's own config.properties (load_models=all, token auth on) from TORCHBAY_HOME,
    addresses from TORCHBAY_HOST and the port variables (see the image_server fixture)."""
    run, ports, keys = image_server
    assert len({ports["inference"], ports["management"], ports["metrics"]}) == 3
    base = f"http://127.0.0.1:{ports['inference']}"
    # GET on KServe v1 predict: 405, as KServe answers it (not the model's readiness)
    assert httpx.get(f"{base}/v1/models/mnist:predict", timeout=30).status_code == 405
    unauthorized = httpx.post(f"{base}/predictions/mnist", json=SAMPLE, timeout=30)
    assert unauthorized.status_code == 401
    _exercise(base, {"Authorization": f"Bearer {keys['inference']['key']}"})
    assert re.search(r"configuration from .*config\.properties", run.output())
    # The entrypoint's own variables (TORCHBAY_HOME, _HOST, _*_PORT, ...) took effect: torchbay
    # must not call them ignored.
    assert "ignored unknown environment variable" not in run.output()


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_torchbay_host_binds_every_listener(
    host: str, archive: Path, container: Any, tmp_path: Path
) -> None:
    """TORCHBAY_HOST alone (gRPC on free ports, no gRPC address variable) binds all five
    listeners there. Were: an IPv6 host made http://::1:8080 (the start refused the address),
    and the image config's gRPC 0.0.0.0 stayed under TORCHBAY_HOST=127.0.0.1."""
    if ":" in host and not _ipv6_loopback():
        pytest.skip("this host has no IPv6 loopback (::1) to bind the IPv6 case to")
    home = tmp_path / "home"
    (home / "model-store").mkdir(parents=True)
    shutil.copy(archive, home / "model-store" / "mnist.mar")
    shutil.copy(DEPLOY / "docker" / "config.properties", home / "config.properties")
    run = container(
        {
            "TORCHBAY_KSERVE_ROOT": str(tmp_path / "no-kserve"),
            "TORCHBAY_HOME": str(home),
            "TORCHBAY_HOST": host,
            "TORCHBAY_INFERENCE_PORT": "0",
            "TORCHBAY_MANAGEMENT_PORT": "0",
            "TORCHBAY_METRICS_PORT": "0",
            "TORCHBAY_GRPC_INFERENCE_PORT": "0",
            "TORCHBAY_GRPC_MANAGEMENT_PORT": "0",
        },
        home,
    )
    ports = run.wait_ready()
    listening = {
        c.laddr.port: c.laddr.ip.removeprefix("::ffff:")  # grpc's IPv4 on an IPv6 socket
        for c in psutil.Process(ports["pid"]).connections("inet")
        if c.status == psutil.CONN_LISTEN
    }
    names = ("inference", "management", "metrics", "grpc_inference", "grpc_management")
    assert {listening.get(ports[n]) for n in names} == {host}, (listening, ports)
    url_host = f"[{host}]" if ":" in host else host
    ready = httpx.get(f"http://{url_host}:{ports['inference']}/v2/health/ready", timeout=30)
    assert ready.status_code == 200, ready.text
    assert run.stop() == 0, run.output()


def test_kserve_runtime_keeps_management_off_the_routed_port(
    archive: Path, container: Any, tmp_path: Path
) -> None:
    """The ClusterServingRuntime's env over KServe's config: the container port (what KServe
    routes clients to) answers inference only; the management API is on the pod's loopback.
    Was: inference and management shared it, so any client could scale the model's workers."""
    runtime = yaml.safe_load(
        (DEPLOY / "k8s" / "overlays" / "kserve" / "servingruntime.yaml").read_text()
    )
    (main,) = runtime["spec"]["containers"]
    env = {e["name"]: e["value"] for e in main["env"]}
    management = env.get("TORCHBAY_MANAGEMENT_ADDRESS", "")
    assert management.startswith("http://127.0.0.1:"), env
    root = tmp_path / "mnt-models"
    (root / "config").mkdir(parents=True)
    (root / "model-store").mkdir()
    shutil.copy(archive, root / "model-store" / "mnist.mar")
    port = free_port()
    assert main["ports"][0]["containerPort"] == 8085
    text = (DEPLOY / "kserve" / "config" / "config.properties").read_text()
    text = text.replace("0.0.0.0:8085", f"127.0.0.1:{port}").replace("0.0.0.0:8082", "127.0.0.1:0")
    (root / "config" / "config.properties").write_text(text)
    env.update(
        TORCHBAY_CONFIG=str(root / "config" / "config.properties"),
        TORCHBAY_MODEL_STORE=str(root / "model-store"),
        TORCHBAY_MANAGEMENT_ADDRESS="http://127.0.0.1:0",  # the manifest's host, a free port
        **GRPC_ON_FREE_PORTS,
    )
    run = container(env, tmp_path)
    ports = run.wait_ready()
    assert ports["inference"] == port != ports["management"]
    routed = f"http://127.0.0.1:{port}"
    scale = httpx.put(f"{routed}/models/mnist", params={"min_worker": 2}, timeout=30)
    assert scale.status_code == 404, scale.text
    predict = httpx.post(f"{routed}/v1/models/mnist:predict", json={"instances": [SAMPLE]})
    assert predict.status_code == 200, predict.text
    described = httpx.get(f"http://127.0.0.1:{ports['management']}/models/mnist", timeout=30)
    assert described.status_code == 200, described.text
    assert run.stop() == 0, run.output()


def _service_links(services: list[dict[str, Any]]) -> dict[str, str]:
    """The variables Kubernetes' service links give a pod for ``services`` (kubelet's rule: the
    name upper-cased, '-' as '_'; the first port is <NAME>_PORT)."""
    env = {}
    for service in services:
        name = service["metadata"]["name"].upper().replace("-", "_")
        ports = [p["port"] for p in service["spec"]["ports"]]
        env |= {f"{name}_SERVICE_HOST": "10.96.0.10", f"{name}_SERVICE_PORT": str(ports[0])}
        env[f"{name}_PORT"] = f"tcp://10.96.0.10:{ports[0]}"
        for port in ports:
            env[f"{name}_PORT_{port}_TCP"] = f"tcp://10.96.0.10:{port}"
            env[f"{name}_PORT_{port}_TCP_PORT"] = str(port)
    return env


def test_kubernetes_service_links_are_not_ports(
    archive: Path, container: Any, tmp_path: Path
) -> None:
    """A pod in the namespace of base/services.yaml gets TORCHBAY_INFERENCE_PORT=tcp://<ip>:8080
    (and _MANAGEMENT_, _METRICS_) from Kubernetes' service links, the entrypoint's own port
    variables: they made http://0.0.0.0:tcp://..., the start refused it, a crash loop. The
    Deployment turns service links off, and the entrypoint ignores such values."""
    k8s = DEPLOY / "k8s" / "base"
    services = list(yaml.safe_load_all((k8s / "services.yaml").read_text()))
    links = _service_links([s for s in services if s])
    assert links["TORCHBAY_INFERENCE_PORT"].startswith("tcp://")
    deployment = yaml.safe_load((k8s / "deployment.yaml").read_text())
    assert deployment["spec"]["template"]["spec"]["enableServiceLinks"] is False
    home = tmp_path / "home"
    (home / "model-store").mkdir(parents=True)
    shutil.copy(archive, home / "model-store" / "mnist.mar")
    config = home / "config.properties"  # the addresses come from here, as in the ConfigMap
    config.write_text(
        "".join(f"{n}_address=http://127.0.0.1:0\n" for n in ("inference", "management", "metrics"))
    )
    env = {"TORCHBAY_CONFIG": str(config), "TORCHBAY_MODEL_STORE": str(home / "model-store")}
    env |= {"TORCHBAY_DISABLE_TOKEN_AUTHORIZATION": "true", **GRPC_ON_FREE_PORTS, **links}
    run = container(env, home)
    ports = run.wait_ready()
    ready = httpx.get(f"http://127.0.0.1:{ports['inference']}/v2/health/ready", timeout=30)
    assert ready.status_code == 200, ready.text
    assert run.stop() == 0, run.output()
