"""examples/digits: the quickstart's int8 archive, served; it reads the held-out sample digits.
And the demo's server (examples/digits/demo.py) takes free ports only."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from torchbay.archiver.package import ArchiveOptions, package

from .conftest import example_module

pytestmark = pytest.mark.slow


def test_digits_int8_served_reads_the_samples(serve, tmp_path: Path) -> None:
    out = tmp_path / "out"
    digits = example_module("digits", "train")
    accuracy = digits.train(out, epochs=8)
    assert accuracy > 0.9
    # The quickstart's archive: torch.export, int8-dynamic, with the parity check.
    options = digits.archive_options(out)
    package(
        ArchiveOptions(
            **options,
            version="1.0",
            convert="export",
            precision="int8-dynamic",
            export_path=tmp_path / "store",
        )
    )
    server = serve(tmp_path / "store", load_models=["digits.mar"])
    correct = 0
    with httpx.Client(timeout=60) as client:
        for digit in range(10):
            body = (out / f"sample_{digit}.png").read_bytes()
            reply = client.post(f"{server.url}/predictions/digits", content=body)
            assert reply.status_code == 200, reply.text
            scores = reply.json()
            # topk: 3 from model-config.yaml, most likely first, probabilities
            assert len(scores) == 3 and list(scores.values()) == sorted(scores.values())[::-1]
            assert all(0 <= p <= 1 for p in scores.values()) and sum(scores.values()) <= 1.0001
            correct += max(scores, key=scores.get) == str(digit)
        assert client.post(f"{server.url}/predictions/digits", content=b"GIF89a").status_code == 400
    assert correct >= 9


def _hold(port: int) -> socket.socket | None:
    """A listening socket on 127.0.0.1:``port`` (another server on the host), or None when one
    already listens there (then that one stands in for it)."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        return None
    sock.listen()
    return sock


def test_the_demos_server_takes_free_ports_grpc_included(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo's own ``torchbay serve`` (an empty store: no model to train) starts while
    TorchServe's fixed gRPC ports are taken, and says which free ones it took."""
    for name in ("TORCHBAY_GRPC_INFERENCE_PORT", "TORCHBAY_GRPC_MANAGEMENT_PORT"):
        monkeypatch.delenv(name, raising=False)  # tests/conftest.py's: a user has none
    demo = example_module("digits", "demo")
    held = [s for s in map(_hold, (7070, 7071)) if s is not None]
    (tmp_path / "store").mkdir()
    server = demo.start_server(tmp_path / "store", tmp_path, ())
    try:
        ports = demo.wait_ready(server, tmp_path / demo.READY)
        assert ports is not None, "the demo's server did not start with 7070/7071 taken"
        grpc = {ports["grpc_inference"], ports["grpc_management"]}
        assert len(grpc) == 2 and not grpc & {0, 7070, 7071}, ports
        with socket.create_connection(("127.0.0.1", ports["grpc_inference"]), timeout=30):
            pass  # it listens there
    finally:
        server.terminate()
        server.wait(timeout=60)
        for sock in held:
            sock.close()
