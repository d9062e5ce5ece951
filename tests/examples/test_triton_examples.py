"""Triton's own client example programs, run unchanged against torchbay (issue 28).

The programs are tritonclient's ``src/python/examples/*.py``, vendored in
tests/third_party/triton_client_examples/ (Triton's BSD license beside them). Each runs as a
subprocess, ``python example.py -u 127.0.0.1:PORT`` plus its own flags, against one real server
over the model store that examples/triton/build_models.py builds (torch models that compute what
Triton's example models compute). A program passes when it exits 0 and, where it prints one, its
"PASS" line appears. Each test states why it is skipped or expected to fail.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from PIL import Image
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from .conftest import REPO, _server, example_module

pytestmark = pytest.mark.slow

PROGRAMS = REPO / "tests" / "third_party" / "triton_client_examples"
IMAGE = "IMAGE"  # replaced by the path of the test's generated image

# CUDA shared memory: the programs allocate device memory (tritonclient's cuda_shared_memory,
# which imports cuda-python's cuda.bindings) and the server opens it: they run on a GPU host.
CUDA_SHM = pytest.mark.skipif(
    not torch.cuda.is_available() or find_spec("cuda") is None,
    reason="CUDA shared memory needs a GPU, and tritonclient's cuda_shared_memory needs "
    "cuda-python (cuda.bindings)",
)
ATTRDICT = pytest.mark.skipif(
    find_spec("attrdict") is None,
    reason="image_client.py's HTTP path imports attrdict, whose last release (2.0.1) imports "
    "collections.Mapping and so cannot load on Python 3.10+, against any server",
)
FIXED_URL = pytest.mark.skip(
    reason="memory_growth_test.py takes no -u: it calls localhost:8000 (HTTP) and 8001 (gRPC) only"
)
SERVER_NAME = pytest.mark.xfail(
    strict=True,
    reason="the program requires the server metadata's name to be 'triton'; torchbay answers "
    "'torchbay' (with that one name changed, the whole program passes)",
)


def program(script: str, args: str = "", *, grpc: bool = False, marks: Any = ()) -> Any:
    """One run of ``script`` with ``args`` (space-separated; IMAGE: the generated image)."""
    ident = f"{script.removesuffix('.py')} {args}".strip().replace(IMAGE, "image")
    return pytest.param(script, args.split(), grpc, marks=marks, id=ident)


CLASSIFY = "-c 3 -s INCEPTION IMAGE"  # image_client's top 3, scaled as Inception's input
EXAMPLES = [
    program("simple_http_infer_client.py"),
    program("simple_grpc_infer_client.py", grpc=True),
    program("simple_http_async_infer_client.py"),
    program("simple_grpc_async_infer_client.py", grpc=True),
    program("simple_http_aio_infer_client.py"),
    program("simple_grpc_aio_infer_client.py", grpc=True),
    program("simple_http_string_infer_client.py"),
    program("simple_grpc_string_infer_client.py", grpc=True),
    program("simple_http_health_metadata.py", marks=SERVER_NAME),
    program("simple_grpc_health_metadata.py", grpc=True, marks=SERVER_NAME),
    program("simple_grpc_custom_args_client.py", grpc=True),
    program("simple_grpc_keepalive_client.py", grpc=True),
    program("simple_grpc_custom_repeat.py", grpc=True),
    program("grpc_explicit_int_content_client.py", grpc=True),
    program("grpc_explicit_int8_content_client.py", grpc=True),
    program("grpc_explicit_byte_content_client.py", grpc=True),
    program("grpc_client.py", grpc=True),
    program("image_client.py", f"-m densenet_onnx {CLASSIFY}", marks=ATTRDICT),
    program("image_client.py", f"-m inception_graphdef -b 2 {CLASSIFY}", marks=ATTRDICT),
    program("image_client.py", f"-i grpc -m densenet_onnx {CLASSIFY}", grpc=True),
    program("image_client.py", f"-i grpc -m inception_graphdef -b 2 {CLASSIFY}", grpc=True),
    program(
        "image_client.py", f"-i grpc -a --streaming -m inception_graphdef {CLASSIFY}", grpc=True
    ),
    program("grpc_image_client.py", f"-m inception_graphdef {CLASSIFY}", grpc=True),
    program("grpc_image_client.py", f"-m densenet_onnx {CLASSIFY}", grpc=True),
    program("ensemble_image_client.py", "-c 3 IMAGE"),
    program("ensemble_image_client.py", "-i grpc -c 3 IMAGE", grpc=True),
    program("simple_http_shm_client.py"),
    program("simple_grpc_shm_client.py", grpc=True),
    program("simple_http_shm_string_client.py"),
    program("simple_grpc_shm_string_client.py", grpc=True),
    program("reuse_infer_objects_client.py"),  # registers system shared memory
    program("reuse_infer_objects_client.py", "-i grpc", grpc=True),
    program("simple_http_cudashm_client.py", marks=CUDA_SHM),
    program("simple_grpc_cudashm_client.py", grpc=True, marks=CUDA_SHM),
    program("simple_http_sequence_sync_infer_client.py"),
    program("simple_grpc_sequence_sync_infer_client.py", grpc=True),
    program("simple_grpc_sequence_stream_infer_client.py", grpc=True),
    program("simple_grpc_aio_sequence_stream_infer_client.py", grpc=True),
    program("memory_growth_test.py", marks=FIXED_URL),
]


@pytest.fixture(scope="session")
def triton_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model store of examples/triton/build_models.py, built once."""
    return example_module("triton", "build_models").build(tmp_path_factory.mktemp("triton"))


@pytest.fixture(scope="module")
def triton_server(triton_store: Path) -> Iterator[Any]:
    """One server with the store's models loaded (but custom_identity_int32, whose only program
    is skipped), HTTP and gRPC on free ports; started once, and stopped after this module so
    that its workers do not hold the host through the rest of the suite."""
    archives = [p.name for p in sorted(triton_store.glob("*.mar"))]
    load = [name for name in archives if name != "custom_identity_int32.mar"]
    config = _server.make_config(triton_store, load_models=load, allow_client_shm=True)
    server = _server.LiveServer(config).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def control_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A server for the model-control programs: the model API on, no model loaded at start,
    over a store of its own that each test fills."""
    store = tmp_path_factory.mktemp("control-store")
    with _server.running(store, enable_model_api=True) as server:
        yield server


@pytest.fixture(scope="session")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small JPEG of seeded noise: the examples only need an image file to classify."""
    path = tmp_path_factory.mktemp("image") / "noise.jpg"
    pixels = np.random.default_rng(0).integers(0, 256, size=(48, 64, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def run_program(script: str, url: str, args: list[str]) -> subprocess.CompletedProcess:
    command = [sys.executable, str(PROGRAMS / script), "-u", url, *args]
    with _host_wide_regions(script):
        return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


@contextlib.contextmanager
def _host_wide_regions(script: str) -> Iterator[None]:
    """The shared-memory programs name their POSIX regions themselves (``/input0_simple``...),
    and those names are the whole host's: one run of them unlinks another's regions, so another
    suite on the same host takes this file lock while it runs them."""
    if "shared_memory" not in (PROGRAMS / script).read_text():
        yield
        return
    with open(Path(tempfile.gettempdir()) / "torchbay-triton-shm-examples.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def assert_passed(script: str, done: subprocess.CompletedProcess) -> None:
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{output[-3000:]}"
    if 'print("PASS' in (PROGRAMS / script).read_text():  # the program reports success
        assert "PASS" in done.stdout, f"{script} printed no PASS line:\n{output[-3000:]}"


@pytest.mark.parametrize(("script", "args", "grpc"), EXAMPLES)
def test_triton_example(
    triton_server: Any, image: Path, script: str, args: list[str], grpc: bool
) -> None:
    ports = triton_server.server.state.ports
    url = f"127.0.0.1:{ports.grpc_inference if grpc else ports.inference}"
    args = [str(image) if a == IMAGE else a for a in args]
    assert_passed(script, run_program(script, url, args))


FILE_OVERRIDES = pytest.mark.xfail(
    strict=True,
    reason="the program loads with a 'file:' override of a 256-character path and wants "
    "StatusCode.INTERNAL 'failed to poll from model repository' (its own TODO says "
    "INVALID_ARGUMENT is more appropriate); torchbay takes no file overrides and refuses every "
    "one with INVALID_ARGUMENT 'Unsupported load parameter(s)' (every step before passes)",
)


CONTROL = [
    pytest.param("simple_http_model_control.py", 7, False),
    pytest.param("simple_grpc_model_control.py", 8, True, marks=FILE_OVERRIDES),
]


def test_the_readme_counts_the_runs_that_pass() -> None:
    """README's "Differences from Triton" says how many of these runs pass (every run without a
    skip or an expected failure): adding or marking a program changes it there too."""
    passing = sum(not param.marks for param in EXAMPLES + CONTROL)
    row = next(
        line for line in (REPO / "README.md").read_text().splitlines() if "| Examples run" in line
    )
    assert f"({passing} runs pass" in row


@pytest.mark.parametrize(("script", "count", "grpc"), CONTROL)
def test_model_control(
    triton_store: Path, control_server: Any, script: str, count: int, grpc: bool
) -> None:
    """The model-control programs load, reload with a config, and unload ``simple`` on a server
    that starts with no model loaded (Triton's explicit model control), and first count the
    repository's models: the HTTP one wants 7, the gRPC one 8 (the repositories they were
    written for). Their server's store holds that many of our archives (the index reads the
    store at each call), and unloading ``simple`` there does not touch the shared server."""
    store = control_server.server.config.model_store
    for old in store.glob("*.mar"):
        old.unlink()
    archives = sorted(triton_store.glob("*.mar"), key=lambda p: (p.stem != "simple", p.stem))
    for archive in archives[:count]:
        shutil.copy(archive, store)
    ports = control_server.server.state.ports
    url = f"127.0.0.1:{ports.grpc_inference if grpc else ports.inference}"
    assert_passed(script, run_program(script, url, []))
    # Unloaded, ``simple`` is not ready, and gRPC says so as Triton does: ready false, no
    # error; a model the store does not have is still not found.
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports.grpc_inference}")
    assert client.is_model_ready("simple") is False
    with pytest.raises(InferenceServerException, match="nope") as missing:
        client.is_model_ready("nope")
    assert missing.value.status() == "StatusCode.NOT_FOUND"
    client.close()


def test_a_model_without_a_batch_dimension_answers_one_sample(triton_server: Any) -> None:
    """densenet_onnx declares [3, 224, 224] (Triton's max_batch_size 0): a request is one image,
    run as a batch of one; the answer is the model's [1000] scores for it, labelled."""
    client = httpclient.InferenceServerClient(
        f"127.0.0.1:{triton_server.server.state.ports.inference}"
    )
    config = client.get_model_config("densenet_onnx")
    assert config["max_batch_size"] == 0 and config["input"][0]["format"] == "FORMAT_NCHW"
    image = httpclient.InferInput("data_0", [3, 224, 224], "FP32")
    image.set_data_from_numpy(np.zeros((3, 224, 224), dtype=np.float32))
    scores = client.infer("densenet_onnx", [image]).as_numpy("fc6_1")
    assert scores.shape == (1000,) and abs(float(scores.sum()) - 1.0) < 1e-4
    top = httpclient.InferRequestedOutput("fc6_1", class_count=2)
    best = client.infer("densenet_onnx", [image], outputs=[top]).as_numpy("fc6_1")
    assert best.shape == (2,) and best[0].decode().split(":")[2].startswith("CLASS_")
    client.close()


def test_a_bytes_tensor_is_type_string_in_the_model_config(triton_server: Any) -> None:
    """model_config.proto names BYTES ``TYPE_STRING`` (it has no TYPE_BYTES): the REST config
    said TYPE_BYTES, and gRPC's ModelConfig, whose enum has no such value, dropped the
    datatype (TYPE_INVALID)."""
    ports = triton_server.server.state.ports
    http = httpclient.InferenceServerClient(f"127.0.0.1:{ports.inference}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{ports.grpc_inference}")
    try:
        rest = http.get_model_config("simple_string")
        over_grpc = grpc.get_model_config("simple_string").config
    finally:
        http.close(), grpc.close()
    assert [t["data_type"] for t in rest["input"] + rest["output"]] == ["TYPE_STRING"] * 4
    tensors = [*over_grpc.input, *over_grpc.output]
    assert [model_config_pb2.DataType.Name(t.data_type) for t in tensors] == ["TYPE_STRING"] * 4


def _client(server: Any, protocol: str) -> Any:
    """tritonclient's ``protocol`` client of ``server`` (the caller closes it)."""
    ports = server.server.state.ports
    if protocol == "http":
        return httpclient.InferenceServerClient(f"127.0.0.1:{ports.inference}")
    return grpcclient.InferenceServerClient(f"127.0.0.1:{ports.grpc_inference}")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_sequence_request_of_two_rows_is_refused_as_triton_does(
    triton_server: Any, protocol: str
) -> None:
    """Triton's sequence batcher refuses a request whose batch size is over 1 (its
    sequence_batch_scheduler.cc: INVALID_ARG, 400). Was: simple_sequence ran both rows as one
    step of the sequence, 200 [[8], [10]]."""
    client, module = (
        _client(triton_server, protocol),
        httpclient if protocol == "http" else grpcclient,
    )
    try:
        tensor = module.InferInput("INPUT", [2, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[7], [9]], dtype=np.int32))
        with pytest.raises(InferenceServerException) as info:
            client.infer("simple_sequence", [tensor], sequence_id=4244, sequence_start=True)
        assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT"), info.value
        assert "must specify batch-size 1 due to requirements of sequence batcher" in str(
            info.value
        )
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_sequence_model_s_inputs_are_those_a_client_sends(
    triton_server: Any, protocol: str
) -> None:
    """simple_sequence's START and READY are control inputs: the server fills them and refuses a
    request that sends one. Its metadata and configuration listed them among the inputs, so a
    client that builds its request from them (perf_analyzer does) was refused every time; as
    Triton's, they list INPUT alone, and a request built from them is served."""
    client = _client(triton_server, protocol)
    if protocol == "http":
        meta = client.get_model_metadata("simple_sequence")
        config = client.get_model_config("simple_sequence")
    else:
        meta = client.get_model_metadata("simple_sequence", as_json=True)
        config = client.get_model_config("simple_sequence", as_json=True)["config"]
    try:
        assert [t["name"] for t in meta["inputs"]] == ["INPUT"]
        assert [t["name"] for t in config["input"]] == ["INPUT"]
        module = httpclient if protocol == "http" else grpcclient
        tensors = []
        for spec in meta["inputs"]:  # as a client that reads the metadata builds its request
            tensor = module.InferInput(spec["name"], [1, 1], spec["datatype"])
            tensor.set_data_from_numpy(np.array([[7]], dtype=np.int32))
            tensors.append(tensor)
        seq = 4242 if protocol == "http" else 4243
        result = client.infer("simple_sequence", tensors, sequence_id=seq, sequence_start=True)
        assert result.as_numpy("OUTPUT").tolist() == [[8]]  # INPUT + START
        client.infer("simple_sequence", tensors, sequence_id=seq, sequence_end=True)
    finally:
        client.close()


def test_a_sequence_model_s_config_has_triton_s_sequence_batching(
    triton_store: Path, control_server: Any
) -> None:
    """A sequence model's configuration showed dynamic_batching, which tells a Triton client
    (perf_analyzer decides by it) that requests need no sequence: every one it sent was refused.
    It shows sequence_batching, with the control inputs the server fills, and the configuration
    read over either protocol loads back unchanged, one field changed."""
    store = control_server.server.config.model_store
    for old in store.glob("*.mar"):
        old.unlink()
    shutil.copy(triton_store / "simple_sequence.mar", store)
    ports = control_server.server.state.ports
    http = httpclient.InferenceServerClient(f"127.0.0.1:{ports.inference}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{ports.grpc_inference}")
    try:
        http.load_model("simple_sequence")
        config = http.get_model_config("simple_sequence")
        over_grpc = grpc.get_model_config("simple_sequence", as_json=True)["config"]
        for shown in (config, over_grpc):
            assert "dynamic_batching" not in shown
            section = shown["sequence_batching"]
            assert int(section["max_sequence_idle_microseconds"]) == 10_000_000
            assert "oldest" in section  # TorchServe's and Triton's default strategy
            assert [c["name"] for c in section["control_input"]] == ["START", "READY"]
        kinds = [c["control"][0]["kind"] for c in config["sequence_batching"]["control_input"]]
        assert kinds == ["CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_READY"]
        http.load_model("simple_sequence", config=json.dumps({**config, "max_batch_size": 4}))
        assert http.get_model_config("simple_sequence")["max_batch_size"] == 4
        grpc.load_model("simple_sequence", config=json.dumps(over_grpc))
        assert http.get_model_config("simple_sequence")["max_batch_size"] == 8
        changed = {**config, "sequence_batching": {"direct": {}}}
        with pytest.raises(InferenceServerException, match="sequence_batching cannot change"):
            http.load_model("simple_sequence", config=json.dumps(changed))
    finally:
        http.unload_model("simple_sequence")
        http.close(), grpc.close()
