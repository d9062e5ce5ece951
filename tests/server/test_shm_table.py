"""What of the registered shared-memory regions an OIP request carries to its worker
(``SharedMemory.table_for``, plane/shm.py): the regions its JSON names and every CUDA region,
never the whole registry. With 4096 regions registered, each v2 request carried all of them
(~5x the latency of a small request, whatever it named); test_shm.py and test_cuda_shm.py run the
requests that use them on a live server."""

from __future__ import annotations

import gzip
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchbay.server.errors import BadRequest
from torchbay.server.plane.shm import SharedMemory
from torchbay.server.serving.protocol import WireRequest


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[SharedMemory]:
    """500 system regions over one object in a folder standing for /dev/shm, and one CUDA
    region (a server that sees one GPU)."""
    shm = SharedMemory(allow=True, max_regions=600, shm_dir=str(tmp_path), cuda_devices=1)
    key = f"tb-{uuid.uuid4().hex[:12]}"
    (tmp_path / key).write_bytes(b"\0" * 64)
    for i in range(500):
        shm.register_system(f"r{i}", "/" + key, 0, 64)
    shm.register_cuda("gpu", b"\1" * 64, 0, 64)
    yield shm


def _request(header: dict, *lines: bytes, binary: bytes = b"", dumps=json.dumps) -> WireRequest:
    head = dumps(header).encode()
    if binary:
        lines += (b"inference-header-content-length: %d" % len(head),)
    raw = b"\r\n".join([b"host: 127.0.0.1:1", *lines])
    return WireRequest("1", head + binary, "application/json", protocol="v2", raw_headers=raw)


def _tensor(name: str, region: str | None = None) -> dict:
    tensor = {"name": name, "datatype": "INT32", "shape": [16]}
    if region is not None:
        tensor["parameters"] = {"shared_memory_region": region, "shared_memory_byte_size": 64}
    return tensor


def test_a_request_carries_only_the_regions_it_names_and_the_cuda_ones(registry) -> None:
    gpu = registry.table()["gpu"]
    plain = _request({"inputs": [{**_tensor("x"), "data": list(range(16))}]})
    assert registry.table_for(plain) == {"gpu": gpu}
    named = _request({"inputs": [_tensor("x", "r7")], "outputs": [_tensor("y", "r499")]})
    assert set(registry.table_for(named)) == {"r7", "r499", "gpu"}
    unknown = _request({"inputs": [_tensor("x", "nope")]})  # the worker's 404 names it
    assert registry.table_for(unknown) == {"gpu": gpu}
    # the binary extension: the JSON's regions, not bytes of the tensors after it
    fake = b'"shared_memory_region": "r1"'
    binary = _request({"inputs": [_tensor("x", "r3")]}, binary=fake)
    assert set(registry.table_for(binary)) == {"r3", "gpu"}
    # compact JSON (REST clients) and a name with a JSON escape in it
    spaced = _request({"inputs": [_tensor("x", 'r"9')]}, dumps=lambda d: json.dumps(d, indent=2))
    registry.register_system('r"9', *registry.table()["r0"][:3])
    assert set(registry.table_for(spaced)) == {'r"9', "gpu"}


def test_a_body_it_cannot_read_plainly_carries_every_region(registry) -> None:
    everything = registry.table()
    escaped = json.dumps({"inputs": [_tensor("x", "r1")]}).replace("region", "regio\\u006e")
    assert registry.table_for(_request(json.loads(escaped), dumps=lambda _: escaped)) == everything
    header = json.dumps({"inputs": [_tensor("x", "r1")]}).encode()
    raw = b"host: 127.0.0.1:1\r\ncontent-encoding: gzip"
    packed = WireRequest("1", gzip.compress(header), "", protocol="v2", raw_headers=raw)
    assert registry.table_for(packed) == everything
    length = b"inference-header-content-length: 2"  # two lengths: the worker reads the last
    twice = _request({"inputs": [_tensor("x", "r1")]}, length, binary=b"\0")
    assert registry.table_for(twice) == everything
    registry.unregister("system")
    registry.unregister("cuda")
    assert registry.table_for(_request({"inputs": [_tensor("x", "r1")]})) is None


def test_a_register_body_without_a_field_says_which_in_tritons_words(registry) -> None:
    """A REST body without ``key``, ``byte_size`` or ``raw_handle`` (http/shm.py passes None):
    Triton's 'Shared memory register request has no ...' (was 'invalid shm key None' and
    'byte_size must be an integer ..., not None')."""
    key = "/" + registry.table()["r0"][0].lstrip("/")
    for args, field in (((None, 0, 8), "key"), ((key, 0, None), "byte_size")):
        with pytest.raises(BadRequest) as info:
            registry.register_system("new", *args)
        assert info.value.message == f"Shared memory register request has no '{field}' field"
    with pytest.raises(BadRequest) as info:
        registry.register_cuda("new", None, 0, 8)
    assert info.value.message == "Shared memory register request has no 'raw_handle' field"


def test_a_region_is_held_only_by_the_requests_that_name_it(registry) -> None:
    """Unregistering a region that a request in flight names keeps it until that request lets
    go (Triton's in-use regions); the CUDA regions every request carries, and a body not read
    plainly, hold nothing: under load they would never go."""
    table, held = registry.hold(_request({"inputs": [_tensor("x", "r1")]}))
    assert set(table) == {"r1", "gpu"} and held == ("r1",)
    packed = _request({"inputs": [_tensor("x", "r2")]}, b"content-encoding: gzip")
    packed = WireRequest(
        "2",
        gzip.compress(packed.body),
        packed.content_type,
        protocol="v2",
        raw_headers=packed.raw_headers,
    )
    assert registry.hold(packed)[1] == ()
    registry.unregister("cuda")
    registry.unregister("system")
    assert [r["name"] for r in registry.status("system")] == ["r1"]
    assert registry.status("cuda") == []
    registry.release(held)
    assert registry.status("system") == [] and registry.table() is None


def test_the_workers_are_told_when_a_cuda_region_is_gone(registry) -> None:
    """Once a CUDA region is gone (unregistered, and no request holds it) the workers are told
    the CUDA regions left, so that they close its handle then; a system region's unregister, or
    a CUDA one still held, tells them nothing."""
    told: list[dict] = []
    registry.cuda_gone = told.append
    registry.register_cuda("gpu2", b"\2" * 64, 0, 64)
    gpu2 = registry.table()["gpu2"]
    registry.unregister("system", "r1")
    registry.unregister("cuda", "gpu")
    assert told == [{"gpu2": gpu2}]
    table, held = registry.hold(_request({"inputs": [_tensor("x", "gpu2")]}))
    assert held == ("gpu2",) and "gpu2" in table
    registry.unregister("cuda")
    assert told == [{"gpu2": gpu2}]  # a request still reads it: listed, not gone
    assert [r["name"] for r in registry.status("cuda")] == ["gpu2"]
    registry.release(held)
    assert told == [{"gpu2": gpu2}, {}]
    assert registry.status("cuda") == []


def test_unregistering_every_cuda_region_tells_the_workers_once(registry) -> None:
    told: list[dict] = []
    registry.cuda_gone = told.append
    for i in range(3):
        registry.register_cuda(f"more{i}", bytes([i + 2]) * 64, 0, 64)
    registry.unregister("cuda")
    assert told == [{}]
    registry.unregister("cuda")  # nothing left to go: nothing told
    assert told == [{}]
