"""Triton's system shared-memory extension on a real server, with tritonclient's own
shared-memory utilities over HTTP and gRPC: registration (status, register, unregister, their
refusals and limits), inputs read from and outputs written into the client's regions, Triton's
messages for a wrong region, offset or size, a region that vanished or shrank, and CUDA shared
memory refused clearly on a server without a GPU (test_cuda_shm.py has the CUDA path). Every
refusal is a 400 (gRPC INVALID_ARGUMENT) and the worker that saw it is still the same process."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
import tritonclient.utils.shared_memory as shm
from torch import nn
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from .conftest import LiveServer, oip_client, running, tensor_archive

pytestmark = pytest.mark.slow

SIMPLE_YAML = """\
inputs:
  - {name: INPUT0, datatype: INT32, shape: [-1, 16]}
  - {name: INPUT1, datatype: INT32, shape: [-1, 16]}
outputs:
  - {name: OUTPUT0, datatype: INT32, shape: [-1, 16]}
  - {name: OUTPUT1, datatype: INT32, shape: [-1, 16]}
"""
NBYTES = 16 * 4  # one [1, 16] INT32 tensor


class _AddSub(nn.Module):
    """Triton's ``simple`` model: the sum and the difference of two INT32 tensors."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a + b, a - b


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root, work = tmp_path_factory.mktemp("shm"), tmp_path_factory.mktemp("shm-work")
    torch.jit.save(torch.jit.script(_AddSub()), str(work / "simple.pt"))
    example = {
        "a": torch.zeros(1, 16, dtype=torch.int32),
        "b": torch.ones(1, 16, dtype=torch.int32),
    }
    torch.save(example, work / "example.pt")
    (work / "model-config.yaml").write_text(SIMPLE_YAML)
    config = work / "model-config.yaml"
    tensor_archive(root, "simple", work / "simple.pt", work / "example.pt", config_file=config)
    return root


@pytest.fixture(scope="module")
def server(store: Path) -> Iterator[LiveServer]:
    """A server without a GPU (``number_of_gpu=0``, even on a GPU host): CUDA regions refused."""
    settings = {"allow_client_shm": True, "shm_max_regions": 4, "number_of_gpu": 0}
    with running(store, load_models=["simple.mar"], **settings) as s:
        yield s


@pytest.fixture
def http(server: LiveServer) -> Iterator[triton_http.InferenceServerClient]:
    with oip_client(server, "http", "system") as client:
        yield client


@pytest.fixture
def grpc_client(server: LiveServer) -> Iterator[triton_grpc.InferenceServerClient]:
    with oip_client(server, "grpc", "system") as client:
        yield client


@pytest.fixture
def regions() -> Iterator[object]:
    """``make(name, size)``: a fresh POSIX shared-memory object (key ``/tb-<uuid>``), destroyed
    when the test ends."""
    made: list[object] = []

    def make(name: str, size: int) -> tuple[object, str]:
        key = f"/tb-{uuid.uuid4().hex[:12]}"
        handle = shm.create_shared_memory_region(name, key, size)
        made.append(handle)
        return handle, key

    yield make
    for handle in made:
        with contextlib.suppress(Exception):
            shm.destroy_shared_memory_region(handle)


def _data() -> tuple[np.ndarray, np.ndarray]:
    return np.arange(16, dtype=np.int32).reshape(1, 16), np.full((1, 16), 3, dtype=np.int32)


def _inputs(module, region: str, offset: int = 0, size: int = NBYTES) -> list:
    a = module.InferInput("INPUT0", [1, 16], "INT32")
    a.set_shared_memory(region, size, offset=offset)
    b = module.InferInput("INPUT1", [1, 16], "INT32")
    b.set_shared_memory(region, NBYTES, offset=offset + NBYTES)
    return [a, b]


def _outputs(module, region: str, size: int = NBYTES) -> list:
    outs = []
    for i, name in enumerate(("OUTPUT0", "OUTPUT1")):
        out = module.InferRequestedOutput(name)
        out.set_shared_memory(region, size, offset=i * NBYTES)
        outs.append(out)
    return outs


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_and_outputs_in_shared_memory(
    server: LiveServer, http, grpc_client, regions, protocol: str
) -> None:
    client, module = (http, triton_http) if protocol == "http" else (grpc_client, triton_grpc)
    a, b = _data()
    ip, ip_key = regions("in", 2 * NBYTES)
    op, op_key = regions("out", 2 * NBYTES)
    shm.set_shared_memory_region(ip, [a])
    shm.set_shared_memory_region(ip, [b], offset=NBYTES)
    client.register_system_shared_memory("in", ip_key, 2 * NBYTES)
    client.register_system_shared_memory("out", op_key, 2 * NBYTES)

    result = client.infer("simple", _inputs(module, "in"), outputs=_outputs(module, "out"))

    np.testing.assert_array_equal(shm.get_contents_as_numpy(op, np.int32, [1, 16]), a + b)
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(op, np.int32, [1, 16], offset=NBYTES), a - b
    )
    output = result.get_output("OUTPUT0")
    shape = output["shape"] if protocol == "http" else list(output.shape)
    assert shape == [1, 16]
    if protocol == "http":  # Triton's answer for an output in shared memory: no data
        assert "data" not in output and "binary_data_size" not in output.get("parameters", {})
    # The client's input region is never written (the worker reads a copy of it).
    np.testing.assert_array_equal(shm.get_contents_as_numpy(ip, np.int32, [1, 16]), a)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_one_input_in_shared_memory_beside_one_sent_in_the_request(
    http, grpc_client, regions, protocol: str
) -> None:
    client, module = (http, triton_http) if protocol == "http" else (grpc_client, triton_grpc)
    a, b = _data()
    ip, ip_key = regions("in", NBYTES)
    shm.set_shared_memory_region(ip, [a])
    client.register_system_shared_memory("in", ip_key, NBYTES)
    first = module.InferInput("INPUT0", [1, 16], "INT32")
    first.set_shared_memory("in", NBYTES)
    second = module.InferInput("INPUT1", [1, 16], "INT32")
    second.set_data_from_numpy(b)

    result = client.infer("simple", [first, second])

    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_status_register_and_unregister(server: LiveServer, http, grpc_client, regions) -> None:
    _, key_a = regions("a", 256)
    _, key_b = regions("b", 256)
    http.register_system_shared_memory("a", key_a, 128, offset=64)
    grpc_client.register_system_shared_memory("b", key_b, 256)

    status = httpx.get(f"{server.url}/v2/systemsharedmemory/status").json()
    assert sorted(status, key=lambda r: r["name"]) == [
        {"name": "a", "key": key_a, "offset": 64, "byte_size": 128},
        {"name": "b", "key": key_b, "offset": 0, "byte_size": 256},
    ]
    one = grpc_client.get_system_shared_memory_status("a", as_json=True)
    assert one["regions"]["a"] == {"name": "a", "key": key_a, "offset": "64", "byte_size": "128"}

    grpc_client.unregister_system_shared_memory("a")
    assert [r["name"] for r in http.get_system_shared_memory_status()] == ["b"]
    unknown = httpx.get(f"{server.url}/v2/systemsharedmemory/region/a/status")
    assert unknown.status_code == 404  # Triton's NOT_FOUND
    assert unknown.json() == {"error": "Unable to find system shared memory region: 'a'"}
    http.unregister_system_shared_memory("not-registered")  # as Triton: not an error
    http.unregister_system_shared_memory()
    assert http.get_system_shared_memory_status() == []


def _refused(call, fragment: str, code: int = 400, grpc_code: str = "") -> None:
    with pytest.raises(InferenceServerException) as info:
        call()
    assert fragment in info.value.message(), info.value.message()
    status = str(info.value.status())
    grpc_code = grpc_code or ("INVALID_ARGUMENT" if code == 400 else "NOT_FOUND")
    assert status in (str(code), f"StatusCode.{grpc_code}"), status


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_registration_refusals(http, grpc_client, regions, protocol: str) -> None:
    client = http if protocol == "http" else grpc_client
    _, key = regions("r", 128)
    _refused(
        lambda: client.register_system_shared_memory("r", "/tb-missing-" + uuid.uuid4().hex, 8),
        "Unable to open shared memory region",
    )
    _refused(lambda: client.register_system_shared_memory("r", "/a/b", 8), "invalid shm key")
    _refused(lambda: client.register_system_shared_memory("r", "/torch_123", 8), "reserved prefix")
    _refused(
        lambda: client.register_system_shared_memory("r", key, 100, offset=64),
        "failed to register shared memory region 'r': invalid args",
    )
    _refused(  # a uint64 over gRPC: out of range, said so (was "must be an integer >= 0")
        lambda: client.register_system_shared_memory("r", key, 8, offset=(1 << 64) - 1),
        f"offset must be an integer from 0 to {(1 << 63) - 1}, not 18446744073709551615",
    )
    client.register_system_shared_memory("r", key, 128)
    # a name taken: Triton's ALREADY_EXISTS (HTTP 400; gRPC ALREADY_EXISTS, not INVALID_ARGUMENT)
    taken = "shared memory region 'r' already in manager"
    _refused(
        lambda: client.register_system_shared_memory("r", key, 8), taken, 400, "ALREADY_EXISTS"
    )


def test_at_most_max_regions(http, regions) -> None:
    for i in range(4):  # the server's shm_max_regions
        _, key = regions(f"r{i}", 16)
        http.register_system_shared_memory(f"r{i}", key, 16)
    _, key = regions("r4", 16)
    _refused(lambda: http.register_system_shared_memory("r4", key, 16), "at most 4 regions")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_requests_naming_a_wrong_region_offset_or_size(
    server: LiveServer, http, grpc_client, regions, protocol: str
) -> None:
    client, module = (http, triton_http) if protocol == "http" else (grpc_client, triton_grpc)
    pids = server.worker_pids()
    _ip, ip_key = regions("in", 2 * NBYTES)
    _op, op_key = regions("out", 2 * NBYTES)
    client.register_system_shared_memory("in", ip_key, 2 * NBYTES)
    client.register_system_shared_memory("out", op_key, 2 * NBYTES)
    cases = [
        (_inputs(module, "in", offset=2 * NBYTES), None, "Invalid offset for shared memory"),
        (_inputs(module, "in", offset=NBYTES + 4), None, "Invalid offset + byte size"),
        (
            _inputs(module, "in", size=NBYTES - 4),
            None,
            # Triton's words (core infer_request.cc), were "shared_memory_byte_size 60 is not.."
            "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 60",
        ),
        (_inputs(module, "in"), _outputs(module, "out", size=8), "should be at least 64 bytes"),
    ]
    for inputs, outputs, fragment in cases:
        _refused(lambda i=inputs, o=outputs: client.infer("simple", i, outputs=o), fragment)
    # a region that is not registered: Triton's NOT_FOUND (404), as for its status
    nope = "Unable to find shared memory region: 'nope'"
    _refused(lambda: client.infer("simple", _inputs(module, "nope")), nope, 404)
    assert server.worker_pids() == pids


def test_an_offset_and_size_past_uint64_are_tritons_integer_overflow(http, regions) -> None:
    """Triton's qa (L0_shared_memory test_infer_integer_overflow): over REST, an output at
    offset 32 of 2**64 - 32 bytes is 'Integer overflow detected: byte_size ...' (was 'Invalid
    offset + byte size'); a size past uint64 cannot be parsed."""
    _ip, ip_key = regions("in", 2 * NBYTES)
    _op, op_key = regions("out", 2 * NBYTES)
    http.register_system_shared_memory("in", ip_key, 2 * NBYTES)
    http.register_system_shared_memory("out", op_key, 2 * NBYTES)
    for size, fragment in (
        ((1 << 64) - 32, f"Integer overflow detected: byte_size ({(1 << 64) - 32}) + offset (32)"),
        (1 << 64, "'shared_memory_byte_size' must be a non-negative integer"),
    ):
        out = triton_http.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("out", size, offset=32)
        _refused(
            lambda o=out: http.infer("simple", _inputs(triton_http, "in"), outputs=[o]), fragment
        )


def test_a_region_that_vanished_or_shrank_is_refused_and_the_worker_lives(
    server: LiveServer, http, regions
) -> None:
    pids = server.worker_pids()
    _ip, ip_key = regions("in", 2 * NBYTES)
    http.register_system_shared_memory("in", ip_key, 2 * NBYTES)
    with open(f"/dev/shm{ip_key}", "r+b") as f:  # the client shrinks its object
        f.truncate(NBYTES)
    _refused(lambda: http.infer("simple", _inputs(triton_http, "in")), "smaller than its")
    os.unlink(f"/dev/shm{ip_key}")  # ... then removes it, still registered
    _refused(lambda: http.infer("simple", _inputs(triton_http, "in")), "Unable to open shared")
    a, b = _data()  # the worker still answers
    inputs = [triton_http.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    np.testing.assert_array_equal(http.infer("simple", inputs).as_numpy("OUTPUT0"), a + b)
    assert server.worker_pids() == pids


def test_a_grpc_input_in_a_region_that_also_carries_contents_is_refused(
    server: LiveServer, http, regions
) -> None:
    """A ModelInfer input naming a region and carrying typed ``contents`` too: which values?
    Triton refuses it (INVALID_ARGUMENT, its words); the contents were silently dropped."""
    a, _ = _data()
    ip, ip_key = regions("in", 2 * NBYTES)
    shm.set_shared_memory_region(ip, [a, a])
    http.register_system_shared_memory("in", ip_key, 2 * NBYTES)
    request = service_pb2.ModelInferRequest(model_name="simple")
    for i, name in enumerate(("INPUT0", "INPUT1")):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        tensor.parameters["shared_memory_region"].string_param = "in"
        tensor.parameters["shared_memory_byte_size"].int64_param = NBYTES
        tensor.parameters["shared_memory_offset"].int64_param = i * NBYTES
    request.inputs[1].contents.int_contents.extend([100] * 16)
    _grpc_refused(
        server,
        request,
        "unexpected 'content' provided when using shared memory for input tensor 'INPUT1' "
        "for model 'simple'",
    )


def _grpc_refused(server: LiveServer, request: object, words: str) -> None:
    """``request`` (a ModelInferRequest built by hand) is INVALID_ARGUMENT, in ``words``."""
    port = server.server.state.ports.grpc_inference
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request, timeout=60)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == words


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_cuda_shared_memory_is_refused_clearly(http, grpc_client, protocol: str) -> None:
    client = http if protocol == "http" else grpc_client
    _refused(
        lambda: client.register_cuda_shared_memory("gpu", b"\0" * 64, 0, 1024),
        "failed to register CUDA shared memory region 'gpu': this server has no CUDA device",
    )
    client.unregister_cuda_shared_memory()  # as Triton's examples do first: not an error
    status = client.get_cuda_shared_memory_status()
    assert status in ([], {}) or not getattr(status, "regions", None)


def test_extension_listed_only_when_allowed(server: LiveServer, store: Path) -> None:
    meta = httpx.get(f"{server.url}/v2").json()
    assert "system_shared_memory" in meta["extensions"]
    assert "cuda_shared_memory" not in meta["extensions"]
    grpc_meta = triton_grpc.InferenceServerClient(
        f"127.0.0.1:{server.server.state.ports.grpc_inference}"
    ).get_server_metadata()
    assert "system_shared_memory" in grpc_meta.extensions
    with running(store, load_models=[]) as closed:
        assert "system_shared_memory" not in httpx.get(f"{closed.url}/v2").json()["extensions"]
        # Triton (src/common.h, http_server.cc, grpc_server.cc): registering and unregistering
        # are UNSUPPORTED, HTTP 501 and gRPC UNIMPLEMENTED (were 400 INVALID_ARGUMENT, in other
        # words); status answers the (empty) list.
        words = (
            "Client shared memory is disabled. Start the server with "
            "'--allow-client-shm=true' to enable."
        )
        for protocol in ("http", "grpc"):
            with oip_client(closed, protocol) as client:
                for call in (
                    lambda c=client: c.register_system_shared_memory("r", "/whatever", 8),
                    lambda c=client: c.register_cuda_shared_memory("g", b"\0" * 64, 0, 8),
                    client.unregister_system_shared_memory,
                    lambda c=client: c.unregister_cuda_shared_memory("g"),
                ):
                    _refused(call, words, 501, "UNIMPLEMENTED")
                status = client.get_system_shared_memory_status()
                assert status in ([], {}) or not getattr(status, "regions", None)


def test_an_object_made_again_under_the_same_key_is_read_anew(server: LiveServer, http) -> None:
    """The worker keeps its mapping of a region's object between requests; an object the client
    removed and made again under the same key (a new object) is mapped again, never read stale."""
    key = f"/tb-{uuid.uuid4().hex[:12]}"
    a, b = _data()
    second = np.full((1, 16), 100, dtype=np.int32)
    for data in (a, second):
        handle = shm.create_shared_memory_region("in", key, 2 * NBYTES)
        try:
            shm.set_shared_memory_region(handle, [data])
            shm.set_shared_memory_region(handle, [b], offset=NBYTES)
            http.register_system_shared_memory("in", key, 2 * NBYTES)
            result = http.infer("simple", _inputs(triton_http, "in"))
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + b)
            http.unregister_system_shared_memory("in")
        finally:
            shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize(
    ("params", "words"),
    [
        (
            {"shared_memory_byte_size": NBYTES},
            "'shared_memory_byte_size' can not be specified without 'shared_memory_region' "
            "parameter for tensor 'INPUT0'",
        ),
        (
            {"shared_memory_offset": 0},
            "'shared_memory_offset' can not be specified without 'shared_memory_region' "
            "parameter for tensor 'INPUT0'",
        ),
        (
            {"shared_memory_region": "in"},
            "'shared_memory_byte_size' must be specified along with 'shared_memory_region' "
            "parameter for tensor 'INPUT0'",
        ),
        (
            {"shared_memory_region": "in", "shared_memory_byte_size": str(NBYTES)},
            "invalid value type for 'shared_memory_byte_size' parameter for tensor 'INPUT0', "
            "expected int64_param.",
        ),
    ],
)
def test_grpc_shared_memory_parameters_are_checked_as_triton_does(
    server: LiveServer, http, regions, params: dict, words: str
) -> None:
    """Triton's gRPC frontend (grpc_utils.h ParseSharedMemoryParams) refuses a tensor whose
    shared-memory parameters do not go together or are of the wrong type; a size or offset
    without a region was ignored (the input read from the message), a region without a size
    was refused in other words."""
    ip, ip_key = regions("in", 2 * NBYTES)
    shm.set_shared_memory_region(ip, list(_data()))
    http.register_system_shared_memory("in", ip_key, 2 * NBYTES)
    request = service_pb2.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        tensor.contents.int_contents.extend([1] * 16)
    first = request.inputs[0]
    for key, value in params.items():
        kind = "string_param" if isinstance(value, str) else "int64_param"
        setattr(first.parameters[key], kind, value)
    if "shared_memory_region" in params:
        first.ClearField("contents")
    _grpc_refused(server, request, words)


def test_requests_refused_for_their_regions_are_no_executions(
    server: LiveServer, http, regions
) -> None:
    """A request refused for its region (not registered: 404; its size not its shape's: 400)
    never reaches the model: Triton refuses it before (its frontend, its core's checks), so its
    statistics count no execution of it (execution_count counted one each)."""
    ip, ip_key = regions("in", 2 * NBYTES)
    shm.set_shared_memory_region(ip, list(_data()))
    http.register_system_shared_memory("in", ip_key, 2 * NBYTES)

    def stats() -> tuple[int, int, int]:
        (entry,) = http.get_inference_statistics("simple")["model_stats"]
        executed = sum(b["compute_infer"]["count"] for b in entry["batch_stats"])
        return entry["execution_count"], entry.get("inference_count", 0), executed

    before = stats()
    _refused(lambda: http.infer("simple", _inputs(triton_http, "nope")), "Unable to find", 404)
    _refused(lambda: http.infer("simple", _inputs(triton_http, "in", size=NBYTES - 4)), "mismatch")
    assert stats() == before
    http.infer("simple", _inputs(triton_http, "in"))
    assert stats() == (before[0] + 1, before[1] + 1, before[2] + 1)
