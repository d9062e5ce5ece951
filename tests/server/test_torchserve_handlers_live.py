"""TorchServe handlers that lean on TorchServe's own helpers, packed by TorchServe's
torch-model-archiver 0.12 and served unchanged: what BaseHandler's subclasses read after
``super().initialize`` (``model_yaml_config``, ``model_pt_path``), its loading helpers
(``_load_torchscript_model``, ``_load_pickled_model``), ``ts.handler_utils.timer.timed``, and a
module-level ``handle`` beside a handler class (TorchServe's entry point then)."""

from __future__ import annotations

import base64
import io
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from PIL import Image

from tests.tiny_sources import TINY_LINEAR_SOURCE
from tests.torchserve_archivers import run_archiver

from .conftest import LiveServer, running

ARCHIVER = shutil.which("torch-model-archiver", path=str(Path(sys.executable).parent))
pytestmark = pytest.mark.skipif(ARCHIVER is None, reason="torch-model-archiver (dev) missing")

MODEL_PY = TINY_LINEAR_SOURCE

ROWS = """
import torch


def rows(data):
    return torch.tensor([r.get("data") or r.get("body") for r in data], dtype=torch.float32)
"""

# Reads what TorchServe's BaseHandler.initialize sets, and times its stages as TorchServe's
# examples do (handler: {profile: true} makes them metrics).
ATTRS_HANDLER = """
import os

from ts.handler_utils.timer import timed
from ts.torch_handler.base_handler import BaseHandler
from ts.utils.util import CLEANUP_REGEX, check_valid_pt2_backend

from rows import rows


class AttrsHandler(BaseHandler):
    def initialize(self, context):
        super().initialize(context)
        self.scale = self.model_yaml_config["handler"]["scale"]
        self.pt = os.path.basename(self.model_pt_path)

    @timed
    def preprocess(self, data):
        return rows(data) * self.scale

    @timed
    def postprocess(self, data):
        ok = check_valid_pt2_backend("inductor") and not check_valid_pt2_backend("x")
        text = CLEANUP_REGEX.sub("", "<b>bold</b>&amp;")
        return [{"pt": self.pt, "n": len(row), "util": [ok, text]} for row in data.tolist()]
"""

ATTRS_CONFIG = "handler:\n  scale: 3\n  profile: true\n"

# Loads its own model with TorchServe's helpers (the yolov8 and dlrm examples do).
LOADER_HANDLER = """
import os

from ts.torch_handler.base_handler import BaseHandler

from rows import rows


class LoaderHandler(BaseHandler):
    def initialize(self, context):
        self.manifest = context.manifest
        model_dir = context.system_properties["model_dir"]
        path = os.path.join(model_dir, self.manifest["model"]["serializedFile"])
        model_file = self.manifest["model"].get("modelFile")
        if model_file:
            self.model = self._load_pickled_model(model_dir, model_file, path)
        else:
            self.model = self._load_torchscript_model(path)
        self.model.eval()
        self.initialized = True

    def preprocess(self, data):
        return rows(data)
"""

# TorchServe's docs/custom_service.md: a module-level entry point over a handler class.
WRAPPED_HANDLER = """
from ts.torch_handler.base_handler import BaseHandler

from rows import rows


class Inner(BaseHandler):
    def preprocess(self, data):
        return rows(data)


_service = Inner()


def handle(data, context):
    if not _service.initialized:
        _service.initialize(context)
    if data is None:
        return None
    return [{"via": "module handle", "out": out} for out in _service.handle(data, context)]
"""


# TorchServe's near_real_time_video example: a subclass of its ImageClassifier that runs the
# inherited image_processing itself and sets its top-k.
VIDEO_HANDLER = """
import base64
import io

import torch
from PIL import Image
from ts.torch_handler.image_classifier import ImageClassifier


class FramesHandler(ImageClassifier):
    def initialize(self, context):
        super().initialize(context)
        self.set_max_result_classes(2)

    def preprocess(self, data):
        frames = [(row.get("data") or row.get("body"))["frame"] for row in data]
        images = [Image.open(io.BytesIO(base64.b64decode(f))) for f in frames]
        return torch.stack([self.image_processing(image) for image in images])

    def postprocess(self, data):
        return [{"topk": self.get_max_result_classes(), "shape": list(data.shape)}]
"""

# TorchServe's examples/custom_metrics: metrics_config's model metrics, found by get_metric.
METRICS_HANDLER = """
from ts.metrics.metric_type_enum import MetricTypes
from ts.torch_handler.base_handler import BaseHandler

from rows import rows


class CachedMetricsHandler(BaseHandler):
    def initialize(self, context):
        super().initialize(context)
        context.metrics.add_metric(
            name="InitializeCallCount", value=1, unit="count", metric_type=MetricTypes.COUNTER
        )

    def preprocess(self, data):
        metrics, name = self.context.metrics, self.context.model_name
        metrics.get_metric("InferenceRequestCount", MetricTypes.COUNTER).add_or_update(1, [])
        metrics.get_metric("PreprocessCallCount").add_or_update(1, dimension_values=[name])
        batch = metrics.get_metric("RequestBatchSize", metric_type=MetricTypes.GAUGE)
        batch.add_or_update(value=len(data), dimension_values=[name])
        return rows(data)
"""

METRICS_YAML = """
model_metrics:
  counter:
    - {name: InferenceRequestCount, unit: count, dimensions: []}
    - {name: PreprocessCallCount, unit: count, dimensions: [ModelName]}
    - {name: InitializeCallCount, unit: count, dimensions: [ModelName, Level]}
  gauge:
    - {name: RequestBatchSize, unit: count, dimensions: [ModelName]}
"""

# Imports a package that is not installed, which its archive's requirements file names.
NEEDS_HANDLER = """
import not_installed_for_torchbay_tests  # noqa: F401
from ts.torch_handler.base_handler import BaseHandler


class NeedsHandler(BaseHandler):
    pass
"""


class Cnn(torch.nn.Module):
    """An image classifier of three classes for the frames handler."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).mean((2, 3))


class Tiny(torch.nn.Module):
    """MODEL_PY's class: its state dict is the eager archive's."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def _sources(src: Path) -> None:
    torch.manual_seed(0)
    model = Tiny().eval()
    torch.save(model.state_dict(), src / "state.pth")
    torch.jit.script(model).save(str(src / "model.pt"))
    torch.jit.script(Cnn().eval()).save(str(src / "cnn.pt"))
    for name, text in {
        "model.py": MODEL_PY,
        "rows.py": ROWS,
        "attrs_handler.py": ATTRS_HANDLER,
        "loader_handler.py": LOADER_HANDLER,
        "wrapped_handler.py": WRAPPED_HANDLER,
        "model-config.yaml": ATTRS_CONFIG,
        "needs_handler.py": NEEDS_HANDLER,
        "metrics_handler.py": METRICS_HANDLER,
        "metrics.yaml": METRICS_YAML,
        "broken_handler.py": "def broken(:\n",
        "video_handler.py": VIDEO_HANDLER,
        "requirements.txt": "not_installed_for_torchbay_tests==1.0\n",
    }.items():
        (src / name).write_text(text)


def _archive(src: Path, store: Path, name: str, handler: str, *more: str) -> None:
    """``name`` 1.0 packed by torch-model-archiver into ``store``: ``handler`` (a file of
    ``src``, or a name) with rows.py, over model.pt (cnn.pt for ``frames``), or state.pth when
    ``more`` gives a --model-file."""
    serialized = src / ("state.pth" if "--model-file" in more else "model.pt")
    if name == "frames":
        serialized = src / "cnn.pt"
    command = [ARCHIVER, "--model-name", name, "--version", "1.0", "--export-path", str(store)]
    handler = str(src / handler) if handler.endswith(".py") else handler  # else a built-in
    command += ["--handler", handler, "--extra-files", str(src / "rows.py")]
    run_archiver([*command, "--serialized-file", str(serialized), *more], timeout=120)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    src = tmp_path_factory.mktemp("ts-handlers-src")
    store = tmp_path_factory.mktemp("ts-handlers-store")
    _sources(src)
    _archive(src, store, "attrs", "attrs_handler.py", "--config-file", f"{src}/model-config.yaml")
    _archive(src, store, "scripted", "loader_handler.py")
    _archive(src, store, "pickled", "loader_handler.py", "--model-file", str(src / "model.py"))
    _archive(src, store, "wrapped", "wrapped_handler.py")
    _archive(src, store, "needs", "needs_handler.py", "-r", str(src / "requirements.txt"))
    _archive(src, store, "cached", "metrics_handler.py")
    _archive(src, store, "broken", "broken_handler.py")
    _archive(src, store, "frames", "video_handler.py")
    _archive(src, store, "cpp", "BaseHandler", "--runtime", "LSP")
    (src / "source_vocab.pt").write_bytes(b"torchtext")  # only its name matters here
    _archive(src, store, "text", "text_classifier", "--extra-files", f"{src}/source_vocab.pt")
    names = ("attrs", "scripted", "pickled", "wrapped", "cached", "frames")
    loaded = [f"{name}.mar" for name in names]
    metrics = src / "metrics.yaml"
    with running(store, load_models=loaded, enable_model_api=True, metrics_config=metrics) as live:
        yield live


def _predict(server: LiveServer, model: str) -> httpx.Response:
    return httpx.post(f"{server.url}/predictions/{model}", json=[1, 2, 3, 4], timeout=60)


def test_subclass_reads_model_yaml_config_model_pt_path_and_ts_utils(server: LiveServer) -> None:
    r = _predict(server, "attrs")
    assert r.status_code == 200, r.text
    assert r.json() == {"pt": "model.pt", "n": 3, "util": [True, "bold"]}


def test_timed_stages_are_metrics_with_profile_on(server: LiveServer) -> None:
    assert _predict(server, "attrs").status_code == 200
    server.recorded()
    page = httpx.get(f"{server.metrics_url}/metrics", timeout=30).text
    for stage in ("preprocess", "postprocess"):
        assert f'ts_handler_{stage}{{Level="Model",ModelName="attrs"' in page, stage


@pytest.mark.parametrize("model", ["scripted", "pickled"])
def test_base_handler_loading_helpers(server: LiveServer, model: str) -> None:
    r = _predict(server, model)
    assert r.status_code == 200, r.text
    torch.manual_seed(0)
    with torch.no_grad():
        expected = Tiny()(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))[0].tolist()
    assert r.json() == pytest.approx(expected, abs=1e-5)


def test_module_level_handle_is_the_entry_point_beside_a_class(server: LiveServer) -> None:
    r = _predict(server, "wrapped")
    assert r.status_code == 200, r.text
    assert r.json()["via"] == "module handle"


def test_missing_package_of_the_requirements_file_is_named(server: LiveServer) -> None:
    """torchbay never installs an archive's requirements file (TorchServe does with
    install_py_dep_per_model=true): the load failure says so."""
    params = {"url": "needs.mar", "initial_workers": 1, "synchronous": "true"}
    r = httpx.post(f"{server.management_url}/models", params=params, timeout=120)
    assert r.status_code == 500, r.text
    message = r.json()["message"]
    assert "not_installed_for_torchbay_tests" in message
    assert "requirements file 'requirements.txt' is not installed by torchbay" in message


def test_metrics_config_model_metrics_are_in_the_handlers_cache(server: LiveServer) -> None:
    """TorchServe's custom_metrics example: get_metric finds what metrics_config declares,
    add_or_update records exactly its dimensions, and what initialize records is published too
    (TorchServe's /metrics in that README)."""
    for _ in range(2):
        r = _predict(server, "cached")
        assert r.status_code == 200, r.text
    server.recorded()
    page = httpx.get(f"{server.metrics_url}/metrics", timeout=30).text
    samples = {line.split("{")[0]: line for line in page.splitlines() if "Hostname=" in line}
    assert samples["InferenceRequestCount"].startswith("InferenceRequestCount{Hostname=")
    assert samples["InferenceRequestCount"].endswith("} 2.0")
    initialized = samples["InitializeCallCount"]
    assert initialized.startswith('InitializeCallCount{ModelName="cached",Level="Model",Hostname=')
    assert initialized.endswith("} 1.0"), initialized
    for name, value in (("PreprocessCallCount", "2.0"), ("RequestBatchSize", "1.0")):
        assert samples[name].startswith(f'{name}{{ModelName="cached",Hostname='), samples[name]
        assert samples[name].endswith(f"}} {value}"), samples[name]


def test_a_load_failure_answers_no_server_path(server: LiveServer) -> None:
    """A handler that does not compile: the 500 names the error, not where the server keeps
    the model (a SyntaxError's repr holds the file's path)."""
    params = {"url": "broken.mar", "initial_workers": 1, "synchronous": "true"}
    r = httpx.post(f"{server.management_url}/models", params=params, timeout=120)
    assert r.status_code == 500, r.text
    message = r.json()["message"]
    assert "SyntaxError" in message and "broken_handler.py" in message
    workdir = str(server.server.registry.workdir)
    assert workdir not in message and "<path>" in message, message


def test_image_classifier_subclass_runs_the_inherited_image_processing(
    server: LiveServer,
) -> None:
    picture = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 10, 10)).save(picture, format="PNG")
    frame = base64.b64encode(picture.getvalue()).decode()
    r = httpx.post(f"{server.url}/predictions/frames", json={"frame": frame}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json() == {"topk": 2, "shape": [1, 3]}


def test_an_archive_for_torchserves_cpp_backend_is_refused(server: LiveServer) -> None:
    params = {"url": "cpp.mar", "initial_workers": 1, "synchronous": "true"}
    r = httpx.post(f"{server.management_url}/models", params=params, timeout=120)
    assert r.status_code == 400, r.text
    assert "runtime 'LSP' is not served" in r.json()["message"]


def test_a_torchserve_text_classifier_archive_names_its_vocabulary(server: LiveServer) -> None:
    params = {"url": "text.mar", "initial_workers": 1, "synchronous": "true"}
    r = httpx.post(f"{server.management_url}/models", params=params, timeout=120)
    assert r.status_code == 500, r.text
    assert "source_vocab.pt (a pickled torchtext vocabulary) is not read" in r.json()["message"]
