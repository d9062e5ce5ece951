"""Triton's CUDA shared-memory extension on a real server, with tritonclient's own clients over
HTTP and gRPC, on a host without a GPU: the worker's four CUDA calls are replaced by a fake at
their one seam (assets/fake_cuda_ipc.py, "device memory" backed by host memory, loaded by the
worker through ``TORCHBAY_CUDA_IPC``), everything above it is the real code. The server is told
it sees one GPU (``gpu_count=1``, the seam of the GPUs found) and places its worker on the CPU
(``deviceType: cpu``).

Covered: registration, status and unregister in the one registry (names shared with system
regions, the same limits), the extension advertised, inputs read from and outputs written into
the client's regions, each handle opened once per worker and closed once unregistered and
unused, Triton's messages for a wrong region, offset or size, and a handle that cannot be opened.
The real seam's own test (tests/handlers/test_cuda_ipc.py) and Triton's cudashm example programs
need a GPU."""

from __future__ import annotations

import base64
import contextlib
import gc
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from .conftest import LiveServer, oip_client, running
from .test_shm import NBYTES, _data, _inputs, _outputs, _refused, store  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow

ASSETS = Path(__file__).parent / "assets"
sys.path.insert(0, str(ASSETS))
import fake_cuda_ipc  # noqa: E402  (the test's side of the fake: the handles it makes)

MODELS = {"simple": {"1": {"marName": "simple.mar", "defaultVersion": True, "deviceType": "cpu"}}}


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake's record of the worker's opens and closes."""
    return tmp_path_factory.mktemp("cuda-shm") / "ipc.log"


@pytest.fixture(scope="module")
def server(store: Path, log: Path) -> Iterator[LiveServer]:  # noqa: F811
    settings = {"allow_client_shm": True, "shm_max_regions": 4}
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TORCHBAY_CUDA_IPC", str(ASSETS / "fake_cuda_ipc.py"))
        env.setenv("TORCHBAY_FAKE_CUDA_LOG", str(log))
        with running(store, gpu_count=1, models=MODELS, **settings) as live:
            yield live


@pytest.fixture
def http(server: LiveServer) -> Iterator[triton_http.InferenceServerClient]:
    with oip_client(server, "http", "cuda", "system") as client:
        yield client


@pytest.fixture
def grpc_client(server: LiveServer) -> Iterator[triton_grpc.InferenceServerClient]:
    with oip_client(server, "grpc", "cuda") as client:
        yield client


class Device:
    """The test's "device memory": POSIX objects the fake's handles name, removed at the end."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def alloc(self, size: int) -> str:
        """A zeroed allocation of ``size`` bytes; its raw handle in base64 (as tritonclient's
        ``cuda_shared_memory.get_raw_handle`` gives it)."""
        name = f"tb-cuda-{uuid.uuid4().hex[:12]}"
        with open(f"/dev/shm/{name}", "wb") as f:
            f.write(bytes(size))
        self.names.append(name)
        return base64.b64encode(fake_cuda_ipc.make_handle(name)).decode()

    def path(self, handle: str) -> str:
        return "/dev/shm/" + base64.b64decode(handle).split(b":", 1)[1].rstrip(b"\0").decode()

    def put(self, handle: str, array: np.ndarray, offset: int = 0) -> None:
        with open(self.path(handle), "r+b") as f:
            f.seek(offset)
            f.write(array.tobytes())

    def get(self, handle: str, shape: list[int], offset: int = 0) -> np.ndarray:
        with open(self.path(handle), "rb") as f:
            f.seek(offset)
            return np.frombuffer(f.read(4 * int(np.prod(shape))), dtype=np.int32).reshape(shape)


@pytest.fixture
def device() -> Iterator[Device]:
    made = Device()
    yield made
    for name in made.names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"/dev/shm/{name}")


def _events(log: Path, handle: str) -> list[str]:
    """The fake's events (``open``/``close``) for one allocation, in order."""
    name = base64.b64decode(handle).split(b":", 1)[1].rstrip(b"\0").decode()
    lines = log.read_text().splitlines() if log.exists() else []
    return [line.split()[0] for line in lines if line.split()[1] == name]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_and_outputs_in_cuda_shared_memory(
    server: LiveServer, http, grpc_client, device: Device, log: Path, protocol: str
) -> None:
    client, module = (http, triton_http) if protocol == "http" else (grpc_client, triton_grpc)
    a, b = _data()
    ip, op = device.alloc(2 * NBYTES), device.alloc(2 * NBYTES)
    device.put(ip, a)
    device.put(ip, b, offset=NBYTES)
    client.register_cuda_shared_memory("in", ip, 0, 2 * NBYTES)
    client.register_cuda_shared_memory("out", op, 0, 2 * NBYTES)
    pids = server.worker_pids()

    for step in range(3):  # the handles are opened at the first request only
        device.put(ip, a + step)
        result = client.infer("simple", _inputs(module, "in"), outputs=_outputs(module, "out"))
        np.testing.assert_array_equal(device.get(op, [1, 16]), a + step + b)
        np.testing.assert_array_equal(device.get(op, [1, 16], offset=NBYTES), a + step - b)

    output = result.get_output("OUTPUT0")
    shape = output["shape"] if protocol == "http" else list(output.shape)
    assert shape == [1, 16]
    if protocol == "http":  # as for system regions: the entry carries no data
        assert "data" not in output and "binary_data_size" not in output.get("parameters", {})
    assert _events(log, ip) == _events(log, op) == ["open"]
    client.unregister_cuda_shared_memory()  # closed then, as Triton does: no request needed
    _wait_until(lambda: _events(log, ip) == _events(log, op) == ["open", "close"])
    plain = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    plain[0].set_data_from_numpy(a)
    plain[1].set_data_from_numpy(b)
    client.infer("simple", plain)
    assert _events(log, ip) == _events(log, op) == ["open", "close"]
    assert server.worker_pids() == pids


def _wait_until(done: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll ``done`` (the worker closes a handle when it reads the frontend's frame)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "not within the timeout"
        time.sleep(0.02)


def test_status_register_and_unregister_share_one_registry(
    server: LiveServer, http, grpc_client, device: Device
) -> None:
    http.register_cuda_shared_memory("a", device.alloc(256), 0, 256)
    grpc_client.register_cuda_shared_memory("b", device.alloc(128), 0, 128)

    status = httpx.get(f"{server.url}/v2/cudasharedmemory/status").json()
    assert sorted(status, key=lambda r: r["name"]) == [
        {"name": "a", "device_id": 0, "byte_size": 256},
        {"name": "b", "device_id": 0, "byte_size": 128},
    ]
    one = grpc_client.get_cuda_shared_memory_status("a", as_json=True)
    assert one["regions"]["a"] == {"name": "a", "byte_size": "256"}  # device_id 0: a default
    assert http.get_system_shared_memory_status() == []
    wrong_kind = httpx.get(f"{server.url}/v2/systemsharedmemory/region/a/status")
    assert wrong_kind.status_code == 404  # Triton's NOT_FOUND
    assert "'a' is registered as CUDA shared memory" in wrong_kind.json()["error"]
    # one namespace: a system region cannot take a CUDA region's name
    device.alloc(64)  # (its POSIX object serves as a system region's here)
    _refused(
        lambda: http.register_system_shared_memory("a", "/" + device.names[-1], 64),
        "'a' already in manager",
    )
    grpc_client.unregister_cuda_shared_memory("a")
    assert [r["name"] for r in http.get_cuda_shared_memory_status()] == ["b"]
    http.unregister_system_shared_memory()  # the other kind's: b stays
    assert [r["name"] for r in http.get_cuda_shared_memory_status()] == ["b"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_registration_refusals(http, grpc_client, device: Device, protocol: str) -> None:
    client = http if protocol == "http" else grpc_client
    handle = device.alloc(64)
    short = base64.b64encode(b"\1" * 16).decode()
    _refused(lambda: client.register_cuda_shared_memory("r", short, 0, 64), "64 bytes of a")
    _refused(
        lambda: client.register_cuda_shared_memory("r", handle, 1, 64),
        "device_id 1 is not one of this server's 1 GPUs",
    )
    _refused(lambda: client.register_cuda_shared_memory("r", handle, 0, 0), "byte_size must be")
    client.register_cuda_shared_memory("r", handle, 0, 64)
    taken = "already in manager"  # Triton's ALREADY_EXISTS: HTTP 400
    _refused(
        lambda: client.register_cuda_shared_memory("r", handle, 0, 64), taken, 400, "ALREADY_EXISTS"
    )


def test_a_b64_handle_that_is_not_base64_is_refused(server: LiveServer) -> None:
    body = {"raw_handle": {"b64": "not base64!"}, "device_id": 0, "byte_size": 64}
    answer = httpx.post(f"{server.url}/v2/cudasharedmemory/region/r/register", json=body)
    assert answer.status_code == 400
    assert "raw_handle must be the 64 bytes of a cudaIpcMemHandle_t" in answer.json()["error"]


def test_regions_of_both_kinds_count_against_one_limit(http, device: Device) -> None:
    for i in range(3):
        http.register_cuda_shared_memory(f"c{i}", device.alloc(16), 0, 16)
    device.alloc(16)
    http.register_system_shared_memory("s", "/" + device.names[-1], 16)
    _refused(
        lambda: http.register_cuda_shared_memory("c3", device.alloc(16), 0, 16),
        "at most 4 regions",
    )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_requests_naming_a_wrong_region_offset_size_or_handle(
    server: LiveServer, http, grpc_client, device: Device, protocol: str
) -> None:
    client, module = (http, triton_http) if protocol == "http" else (grpc_client, triton_grpc)
    pids = server.worker_pids()
    client.register_cuda_shared_memory("in", device.alloc(2 * NBYTES), 0, 2 * NBYTES)
    client.register_cuda_shared_memory("out", device.alloc(2 * NBYTES), 0, 2 * NBYTES)
    dead = base64.b64encode(b"\7" * 64).decode()  # no allocation: the open fails in the worker
    client.register_cuda_shared_memory("dead", dead, 0, 2 * NBYTES)
    cases = [
        (_inputs(module, "in", offset=2 * NBYTES), None, "Invalid offset for shared memory"),
        (_inputs(module, "in", offset=NBYTES + 4), None, "Invalid offset + byte size"),
        (
            _inputs(module, "in", size=NBYTES - 4),
            None,
            "'INPUT0' for model 'simple'. Expected 64, got 60",
        ),
        (_inputs(module, "in", offset=2), None, "is not a multiple of the datatype's 4-byte"),
        (_inputs(module, "in"), _outputs(module, "out", size=8), "should be at least 64 bytes"),
        (_inputs(module, "dead"), None, "Unable to open CUDA shared memory handle"),
    ]
    for inputs, outputs, fragment in cases:
        _refused(lambda i=inputs, o=outputs: client.infer("simple", i, outputs=o), fragment)
    nope = "Unable to find shared memory region: 'nope'"  # Triton's NOT_FOUND (404)
    _refused(lambda: client.infer("simple", _inputs(module, "nope")), nope, 404)
    assert server.worker_pids() == pids


def test_extension_advertised_with_a_gpu(server: LiveServer) -> None:
    assert "cuda_shared_memory" in httpx.get(f"{server.url}/v2").json()["extensions"]
    with oip_client(server, "grpc") as client:
        assert "cuda_shared_memory" in client.get_server_metadata().extensions


def test_a_handle_in_use_is_closed_only_when_its_request_is_done(
    device: Device, log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's side alone (in this process, the fake at the seam): a region unregistered
    while a request reads it stays open until that request lets go of its slot."""
    from torchbay.handlers.runtime import cuda_shm, shm

    monkeypatch.setenv("TORCHBAY_CUDA_IPC", str(ASSETS / "fake_cuda_ipc.py"))
    monkeypatch.setenv("TORCHBAY_FAKE_CUDA_LOG", str(log))
    cuda_shm.seam.cache_clear()
    monkeypatch.setattr(cuda_shm, "HANDLES", cuda_shm.Handles())
    handle = device.alloc(NBYTES)
    device.put(handle, np.arange(16, dtype=np.int32))
    table = {"r": [handle, 0, NBYTES, 0]}
    params = {"shared_memory_region": "r", "shared_memory_byte_size": NBYTES}
    tensor = {"name": "x", "datatype": "INT32", "shape": [1, 16], "parameters": params}
    try:
        array = shm.read_input(table, tensor, has_data=False)
        assert isinstance(array, torch.Tensor)
        cuda_shm.HANDLES.forget_unnamed({})  # the region was unregistered meanwhile
        assert _events(log, handle) == ["open"]  # the request still holds its slot
        assert array.sum().item() == sum(range(16))  # ... and reads mapped memory
        del tensor, array
        gc.collect()
        assert _events(log, handle) == ["open", "close"]
    finally:
        cuda_shm.seam.cache_clear()
