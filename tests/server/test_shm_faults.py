"""Triton's system shared memory when the client's object misbehaves under the server: shrunk
while a handler still holds an input read from it, sparse and larger than any address space.
The worker reads and writes the client's object through its file, never through a mapping
(``handlers/runtime/shm.py``), so none of this faults it (SIGBUS) or answers a 500: the request
is answered from the bytes read, or refused with a 400, and the worker is the same process."""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm

from .conftest import ASSETS, LiveServer, build_store, running

pytestmark = pytest.mark.slow

NBYTES = 16 * 4  # one [16] INT32 tensor


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    store = build_store(
        tmp_path_factory, "shm-faults", {"gate": str(ASSETS / "shm_gate_handler.py")}
    )
    settings = {"allow_client_shm": True, "number_of_gpu": 0}
    with running(store, load_models=["gate.mar"], **settings) as live:
        yield live


@pytest.fixture
def key(server: LiveServer) -> Iterator[str]:
    """A fresh object's key (``/tb-<uuid>``); the object and its region are gone afterwards."""
    key = f"/tb-{uuid.uuid4().hex[:12]}"
    yield key
    httpx.post(f"{server.url}/v2/systemsharedmemory/unregister")
    Path(f"/dev/shm{key}").unlink(missing_ok=True)


def _register(server: LiveServer, key: str, byte_size: int) -> None:
    reply = httpx.post(
        f"{server.url}/v2/systemsharedmemory/region/in/register",
        json={"key": key, "offset": 0, "byte_size": byte_size},
    )
    assert reply.status_code == 200, reply.text


def _infer(server: LiveServer, size: int = NBYTES, **parameters: str) -> httpx.Response:
    region = {"shared_memory_region": "in", "shared_memory_byte_size": size}
    body = {
        "parameters": parameters,
        "inputs": [{"name": "x", "datatype": "INT32", "shape": [16], "parameters": region}],
    }
    return httpx.post(f"{server.url}/v2/models/gate/infer", json=body, timeout=60)


def test_an_object_shrunk_while_the_handler_holds_its_input(
    server: LiveServer, key: str, tmp_path: Path
) -> None:
    """The client truncates its object after the worker read the input and before the handler
    touches it: the handler's array is the worker's own copy (a mapped one faulted the worker:
    SIGBUS, 503, the model's worker restarted)."""
    pids = server.worker_pids()
    with _in_flight(server, key, tmp_path) as answers:
        os.truncate(f"/dev/shm{key}", 0)
    assert answers[0].status_code == 200, answers[0].text
    assert answers[0].json()["outputs"][0]["data"] == [sum(range(16))]
    assert server.worker_pids() == pids


@contextlib.contextmanager
def _in_flight(server: LiveServer, key: str, tmp_path: Path) -> Iterator[list[httpx.Response]]:
    """A request reading region ``in`` (the object ``key``, 0..15 in it) held by the handler
    until the block ends; the block gets the list its answer is put in, once the block ends."""
    handle = shm.create_shared_memory_region("in", key, NBYTES)
    log, gate = tmp_path / "log", tmp_path / "gate"
    answers: list[httpx.Response] = []
    sender = threading.Thread(
        target=lambda: answers.append(_infer(server, log=str(log), gate=str(gate)))
    )
    try:
        shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.int32)])
        _register(server, key, NBYTES)
        sender.start()
        _wait_for(log)
        yield answers
    finally:
        gate.touch()
        if sender.is_alive():
            sender.join(60)
        shm.destroy_shared_memory_region(handle)


def _wait_for(path: Path) -> None:
    for _ in range(6000):
        if path.exists():
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"the handler never started ({path} missing)")


@pytest.mark.parametrize("size", [1 << 46, 1 << 50])
def test_a_sparse_object_of_any_size(server: LiveServer, key: str, size: int) -> None:
    """An object far larger than its region (sparse: it holds no memory) is read as any other
    (mapping it whole exhausted the worker's address space: a 500 at 2**50)."""
    pids = server.worker_pids()
    with open(f"/dev/shm{key}", "wb") as f:
        f.truncate(size)
    _register(server, key, 2 * NBYTES)
    reply = _infer(server)
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == [0]
    assert server.worker_pids() == pids


def _peak_mib(server: LiveServer) -> int:
    """The worker's peak resident memory so far (VmHWM), in MiB."""
    (pid,) = server.worker_pids()
    status = Path(f"/proc/{pid}/status").read_text()
    return (
        int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])
        >> 10
    )


SPARSE = 1 << 30  # a sparse region of 1 GiB: no memory of the client's, zeros when read


@pytest.mark.parametrize(
    ("datatype", "fragment"),
    [
        ("INT32", f"for input 'x' for model 'gate'. Expected 64, got {SPARSE}"),
        ("BYTES", f"{SPARSE - 4} bytes left after 1 BYTES elements"),
    ],
)
def test_a_region_larger_than_its_tensor_is_refused_without_reading_it(
    server: LiveServer, key: str, datatype: str, fragment: str
) -> None:
    """An input named as 1 GiB of a sparse object: refused from the sizes (a fixed-size datatype)
    or at the first byte past its elements (BYTES, read as parsed), never read whole into the
    worker's memory (a client could make the worker read far more than it has)."""
    pids, peak = server.worker_pids(), _peak_mib(server)
    with open(f"/dev/shm{key}", "wb") as f:
        f.truncate(SPARSE)
    _register(server, key, SPARSE)
    shape = [16] if datatype == "INT32" else [1]
    region = {"shared_memory_region": "in", "shared_memory_byte_size": SPARSE}
    tensor = {"name": "x", "datatype": datatype, "shape": shape, "parameters": region}
    reply = httpx.post(f"{server.url}/v2/models/gate/infer", json={"inputs": [tensor]}, timeout=60)
    assert reply.status_code == 400, reply.text
    assert fragment in reply.json()["error"]
    assert server.worker_pids() == pids
    assert _peak_mib(server) - peak < 256, "the worker read the whole region"


def test_a_region_unregistered_in_use_goes_when_its_request_is_done(
    server: LiveServer, key: str, tmp_path: Path
) -> None:
    """Triton's qa (L0_shared_memory test_unregister_shm_during_inference_*): unregistering a
    region a request still uses succeeds, but the region stays (listed, usable, its name taken)
    until its last request is answered, then goes with no second unregister. It went at once:
    the status listed nothing while the request ran, and the name could be taken again."""
    status = f"{server.url}/v2/systemsharedmemory/status"
    with _in_flight(server, key, tmp_path) as answers:
        assert httpx.post(f"{server.url}/v2/systemsharedmemory/unregister").status_code == 200
        assert [r["name"] for r in httpx.get(status).json()] == ["in"]
        taken = httpx.post(
            f"{server.url}/v2/systemsharedmemory/region/in/register",
            json={"key": key, "byte_size": NBYTES},
        )
        assert taken.json() == {"error": "shared memory region 'in' already in manager"}
    assert answers[0].status_code == 200, answers[0].text
    assert httpx.get(status).json() == []
