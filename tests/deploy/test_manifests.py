"""The Kubernetes manifests: every overlay renders with kustomize, every object validates offline
(Kubernetes kinds against kubernetes-validate's bundled schemas, the CRDs against the vendored
schemas in deploy/schemas/), and the settings that must agree with the server do."""

from __future__ import annotations

import json
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from torchbay.server.config.settings import ServerConfig
from torchbay.server.serve import stop_bound

from .conftest import DEPLOY, require_tool

K8S = DEPLOY / "k8s"
SCHEMAS = DEPLOY / "schemas"
OVERLAYS = ("cpu", "gpu", "keda", "kserve")
K8S_VERSION = "1.32.0"  # the oldest minor the manifests target (preStop exec, autoscaling/v2)
CRDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-monitoring.coreos.com-v1",
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject-keda.sh-v1alpha1",
    ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): (
        "clusterservingruntime-serving.kserve.io-v1alpha1"
    ),
    ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservice-serving.kserve.io-v1beta1",
}


@cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    kubectl = require_tool("kubectl", "needed to render the kustomize overlays")
    out = subprocess.run(
        [kubectl, "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return tuple(doc for doc in yaml.safe_load_all(out.stdout) if doc)


def by_kind(overlay: str, kind: str) -> list[dict[str, Any]]:
    return [doc for doc in render(overlay) if doc["kind"] == kind]


def container(overlay: str) -> dict[str, Any]:
    (deployment,) = by_kind(overlay, "Deployment")
    (main,) = deployment["spec"]["template"]["spec"]["containers"]
    return main


def validate(doc: dict[str, Any]) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
    jsonschema = pytest.importorskip("jsonschema")
    schema_name = CRDS.get((doc["apiVersion"], doc["kind"]))
    if schema_name is None:
        kv.validate(doc, K8S_VERSION, strict=True)
        return
    schema = json.loads((SCHEMAS / f"{schema_name}.json").read_text())
    jsonschema.validate(doc, schema)
    containers = doc["spec"].get("containers")
    if containers:  # a runtime's containers are core/v1 Containers: check them as a Pod's
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}}
        kv.validate({**pod, "spec": {"containers": containers}}, K8S_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates(overlay: str) -> None:
    docs = render(overlay)
    assert docs
    for doc in docs:
        validate(doc)


def test_validation_rejects_a_typo() -> None:
    """The validators do reject bad objects (a check that cannot fail proves nothing)."""
    kv = pytest.importorskip("kubernetes_validate")
    jsonschema = pytest.importorskip("jsonschema")
    (deployment,) = by_kind("cpu", "Deployment")
    bad = json.loads(json.dumps(deployment))
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kv.ValidationError):
        validate(bad)
    (monitor,) = by_kind("cpu", "ServiceMonitor")
    with pytest.raises(jsonschema.ValidationError):
        validate({**monitor, "spec": {**monitor["spec"], "endpoint": []}})
    (runtime,) = by_kind("kserve", "ClusterServingRuntime")
    broken = json.loads(json.dumps(runtime))
    broken["spec"]["containers"][0]["ports"][0]["containerPort"] = "8085"
    with pytest.raises(kv.ValidationError):
        validate(broken)


def test_probes_drain_and_grace() -> None:
    main = container("cpu")
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    assert ports == {"inference": 8080, "management": 8081, "metrics": 8082, "grpc-inference": 7070}
    assert main["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "inference"}
    assert main["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "inference"}
    startup = main["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300  # slow model loads
    (deployment,) = by_kind("cpu", "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    (config_map,) = by_kind("cpu", "ConfigMap")
    props = dict(
        line.split("=", 1)
        for line in config_map["data"]["config.properties"].splitlines()
        if line and not line.startswith("#")
    )
    grace = float(props.get("shutdown_grace_s", ServerConfig().shutdown_grace_s))
    pre_stop = int(main["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert spec["terminationGracePeriodSeconds"] > pre_stop + stop_bound(grace)
    # Token auth on, with the keys every replica shares from the torchbay-keys Secret.
    assert props["disable_token_authorization"] == "false"
    (keys,) = [v for v in spec["volumes"] if v["name"] == "keys"]
    assert keys["secret"]["secretName"] == "torchbay-keys"
    (mount,) = [m for m in main["volumeMounts"] if m["name"] == "keys"]
    assert mount["readOnly"] and props["token_keys_file"].startswith(mount["mountPath"] + "/")
    for address in ("inference_address", "management_address", "metrics_address"):
        assert props[address].startswith("http://0.0.0.0:")
    assert ServerConfig.model_validate(
        {k: v for k, v in props.items() if k in ServerConfig.model_fields}
    )


def test_read_only_roots_log_to_the_console_and_write_no_snapshots() -> None:
    """A read-only root leaves the log on the console only (one warning) and --ncs writes no
    config snapshot (never read back: the entrypoint always passes --ts-config). Were: compose
    logged 'ERROR config snapshot ... not written' at every start and stop; the Deployment's
    LOG_LOCATION put the log files (two lines a request, 600 MB a log) in the tmp emptyDir,
    whose sizeLimit gets the pod evicted; pointing compose at its tmpfs would grow memory."""
    main = container("cpu")
    assert main["securityContext"]["readOnlyRootFilesystem"]
    assert "--ncs" in main["args"]
    assert "LOG_LOCATION" not in {e["name"] for e in main.get("env", [])}
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    torchbay = compose["services"]["torchbay"]
    assert torchbay["read_only"]
    assert torchbay["command"][0] == "serve" and "--ncs" in torchbay["command"]
    assert "LOG_LOCATION" not in torchbay.get("environment", {})


def test_docker_stop_waits_for_the_stop_to_end() -> None:
    """compose's stop_grace_period (docker stop's SIGKILL) covers the stop's bound."""
    torchbay = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())["services"][
        "torchbay"
    ]
    grace = float(
        torchbay.get("environment", {}).get(
            "TORCHBAY_SHUTDOWN_GRACE_S", ServerConfig().shutdown_grace_s
        )
    )
    assert torchbay["stop_grace_period"].endswith("s")
    assert float(torchbay["stop_grace_period"][:-1]) > stop_bound(grace)


def test_gpu_overlay_requests_what_it_uses() -> None:
    main = container("gpu")
    limits, requests = main["resources"]["limits"], main["resources"]["requests"]
    assert limits["nvidia.com/gpu"] == requests["nvidia.com/gpu"] == 1
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["TORCHBAY_NUMBER_OF_GPU"] == str(limits["nvidia.com/gpu"])
    assert "CUDA_VISIBLE_DEVICES" not in env  # the device plugin decides visibility
    (deployment,) = by_kind("gpu", "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes["model-store"]  # filled by the init container
    assert spec["initContainers"][0]["image"] == main["image"]
    assert not by_kind("gpu", "PersistentVolumeClaim")


def test_services_network_policy_and_disruption_budget() -> None:
    services = {s["metadata"]["name"]: s for s in by_kind("cpu", "Service")}
    assert {n: [p["port"] for p in s["spec"]["ports"]] for n, s in services.items()} == {
        "torchbay-inference": [8080, 7070],  # HTTP and gRPC inference
        "torchbay-management": [8081],
        "torchbay-metrics": [8082],
    }
    assert all(s["spec"].get("type", "ClusterIP") == "ClusterIP" for s in services.values())
    (policy,) = by_kind("cpu", "NetworkPolicy")
    rules = policy["spec"]["ingress"]
    open_ports = [p["port"] for rule in rules if "from" not in rule for p in rule["ports"]]
    assert open_ports == [
        "inference",
        "grpc-inference",
    ]  # management and metrics only from named peers
    admins = [r["from"] for r in rules if r["ports"] == [{"port": "management"}]]
    assert admins == [[{"podSelector": {"matchLabels": {"torchbay-admin": "true"}}}]]
    (deployment,) = by_kind("cpu", "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selected = policy["spec"]["podSelector"]["matchLabels"]
    assert selected.items() <= pod_labels.items()
    for service in services.values():
        assert service["spec"]["selector"].items() <= pod_labels.items()
    (pdb,) = by_kind("cpu", "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    (monitor,) = by_kind("cpu", "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


def test_autoscalers_use_one_signal() -> None:
    (hpa,) = by_kind("cpu", "HorizontalPodAutoscaler")
    (metric,) = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == "torchbay_inflight_requests"
    target = metric["pods"]["target"]["averageValue"]
    assert not by_kind("keda", "HorizontalPodAutoscaler")  # KEDA makes its own
    (scaled,) = by_kind("keda", "ScaledObject")
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["metricType"] == "AverageValue" and trigger["metadata"]["threshold"] == target
    assert "torchbay_inflight_requests" in trigger["metadata"]["query"]
    adapter = yaml.safe_load((K8S / "autoscaling" / "prometheus-adapter.yaml").read_text())
    served = {rule["name"]["as"] for rule in adapter["rules"]["custom"]}
    assert metric["pods"]["metric"]["name"] in served


def test_kserve_runtime() -> None:
    (runtime,) = by_kind("kserve", "ClusterServingRuntime")
    spec = runtime["spec"]
    assert spec["protocolVersions"] == ["v1", "v2"]
    assert [f["name"] for f in spec["supportedModelFormats"]] == ["pytorch"]
    (main,) = spec["containers"]
    assert main["name"] == "kserve-container"
    env = {e["name"]: e["value"] for e in main["env"]}
    assert env["TORCHBAY_CONFIG"] == "/mnt/models/config/config.properties"
    assert env["TORCHBAY_MODEL_STORE"] == "/mnt/models/model-store"
    config = (DEPLOY / "kserve" / "config" / "config.properties").read_text()
    assert f"inference_address=http://0.0.0.0:{main['ports'][0]['containerPort']}" in config
    assert spec["annotations"]["prometheus.kserve.io/port"] == "8082"
    (isvc,) = by_kind("kserve", "InferenceService")
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] == "pytorch"


# KServe's own runtimes that serve the pytorch format, as config/runtimes/ ships them (the same
# since v0.11.1 through v0.20: kserve-torchserve.yaml; kserve-tritonserver's pytorch entry has no
# autoSelect, so it never clashes).
KSERVE_PYTORCH_RUNTIMES = {
    "kserve-torchserve": {
        "supportedModelFormats": [
            {"name": "pytorch", "version": "1", "autoSelect": True, "priority": 2}
        ],
        "protocolVersions": ["v1", "v2", "grpc-v2"],
    },
}


def _priority_clash(new: dict[str, Any], existing: dict[str, Any]) -> str | None:
    """KServe's admission webhook rule (validateServingRuntimePriority): two runtimes that share
    a protocol version must not give one auto-selected model format (name and version) the same
    priority; the second runtime applied is denied."""
    if not set(new.get("protocolVersions", [])) & set(existing.get("protocolVersions", [])):
        return None
    for old in existing["supportedModelFormats"]:
        for ours in new["supportedModelFormats"]:
            same = old["name"].lower() == ours["name"].lower() and old.get("version") == ours.get(
                "version"
            )
            auto = old.get("autoSelect") and ours.get("autoSelect")
            if same and auto and old.get("priority") == ours.get("priority") is not None:
                return f"same priority {ours['priority']} for {ours['name']}"
    return None


def test_kserve_runtime_is_admitted_beside_kserves_own() -> None:
    """KServe installs kserve-torchserve (pytorch v1, priority 2) by default: a runtime with the
    same priority for pytorch is denied by KServe's webhook ('same priority assigned for the
    model format pytorch'), so the overlay never applied; ours must rank above it."""
    (runtime,) = by_kind("kserve", "ClusterServingRuntime")
    for name, spec in KSERVE_PYTORCH_RUNTIMES.items():
        assert _priority_clash(runtime["spec"], spec) is None, name
        (theirs,) = spec["supportedModelFormats"]
        (ours,) = runtime["spec"]["supportedModelFormats"]
        assert ours["priority"] > theirs["priority"], "torchbay is to be picked for pytorch"


def test_kserve_pods_stop_within_their_grace_period() -> None:
    """KServe's pods (raw deployment) get terminationGracePeriodSeconds 30, Kubernetes'
    default, unless the InferenceService sets one: the stop's bound (the drain and what
    follows it, docs/shutdown.md) must fit in it, or a drain that runs its course is
    SIGKILLed. Was: the default shutdown_grace_s of 30 s."""
    (runtime,) = by_kind("kserve", "ClusterServingRuntime")
    (main,) = runtime["spec"]["containers"]
    env = {e["name"]: e["value"] for e in main["env"]}
    config = (DEPLOY / "kserve" / "config" / "config.properties").read_text()
    assert "shutdown_grace_s" not in config  # KServe's file, unchanged: the env decides
    grace = float(env.get("TORCHBAY_SHUTDOWN_GRACE_S", ServerConfig().shutdown_grace_s))
    (isvc,) = by_kind("kserve", "InferenceService")
    period = isvc["spec"]["predictor"].get("terminationGracePeriodSeconds", 30)
    assert stop_bound(grace) < period


def test_schemas_name_their_source() -> None:
    for path in SCHEMAS.glob("*.json"):
        schema = json.loads(path.read_text())
        assert "v0." in schema["description"] or "v2." in schema["description"], path.name


def test_schema_files_exist_for_every_crd() -> None:
    for name in CRDS.values():
        assert Path(SCHEMAS / f"{name}.json").is_file(), name
