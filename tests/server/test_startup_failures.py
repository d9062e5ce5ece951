"""A ``torchbay serve`` that cannot start says so in one line, exits non-zero (1; 2 for bad
configuration) and touches nothing of a server already running: its key file and its ports."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from torchbay.server.errors import TorchbayError

from .conftest import LiveServer, make_config, until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def running(model_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A live server with token auth on, its key file at ``<run dir>/key_file.json``."""
    run_dir = tmp_path_factory.mktemp("run")
    live = LiveServer(
        make_config(
            model_store,
            load_models=[],
            disable_token_authorization=False,
            key_file=run_dir / "key_file.json",
        )
    ).start()
    yield live
    live.stop()


def _key_file(server: LiveServer) -> Path:
    return server.server.config.key_file


def _serve(cwd: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """Run the real CLI; (exit code, stderr lines)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHBAY_", "TS_"))}
    clean |= {"TORCHBAY_GRPC_INFERENCE_PORT": "0", "TORCHBAY_GRPC_MANAGEMENT_PORT": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "torchbay", "serve", *args],
        cwd=cwd,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, proc.stderr.splitlines()


def _addresses(**held: int) -> list[str]:
    args = []
    for name in ("inference", "management", "metrics"):
        args += [f"--{name}-address", f"http://127.0.0.1:{held.get(name, 0)}"]
    return args


def _still_serving(server: LiveServer, key_text: str) -> None:
    assert _key_file(server).read_text() == key_text  # intact: same keys, same file
    assert httpx.get(f"{server.url}/ping", timeout=30).status_code == 200
    key = json.loads(key_text)["management"]["key"]
    r = httpx.get(
        f"{server.management_url}/models", headers={"Authorization": f"Bearer {key}"}, timeout=30
    )
    assert r.status_code == 200, r.text


def test_a_port_in_use_is_one_line_and_leaves_the_running_server_alone(running, model_store):
    key_text = _key_file(running).read_text()
    run_dir = _key_file(running).parent  # the failing server's key file is the same file
    ports = running.server.state.ports
    for name in ("inference", "management", "metrics"):
        port = getattr(ports, name)
        code, err = _serve(run_dir, "--model-store", str(model_store), *_addresses(**{name: port}))
        assert code == 1
        assert err == [
            f"torchbay: error: cannot listen on 127.0.0.1:{port} ({name}): address already in use"
        ]
        _still_serving(running, key_text)


def test_a_port_in_use_in_process_writes_no_key_file(running, model_store):
    key_text = _key_file(running).read_text()
    config = make_config(
        model_store,
        inference_address=f"http://127.0.0.1:{running.server.state.ports.inference}",
        disable_token_authorization=False,
        key_file=_key_file(running),
    )
    with pytest.raises(TorchbayError, match=r"cannot listen on .*\(inference\)"):
        LiveServer(config).start()
    _still_serving(running, key_text)


def test_missing_model_store_and_unreadable_tls_files(tmp_path, model_store):
    code, err = _serve(tmp_path, "--model-store", str(tmp_path / "nowhere"), *_addresses())
    assert code == 1
    assert err == [f"torchbay: error: model store {tmp_path / 'nowhere'} does not exist"]

    tls = tmp_path / "tls.properties"
    tls.write_text(f"private_key_file={tmp_path}/key.pem\ncertificate_file={tmp_path}/cert.pem\n")
    (tmp_path / "key.pem").write_text("not a key\n")
    args = ["--model-store", str(model_store), "--ts-config", str(tls), *_addresses()]
    args[args.index("--inference-address") + 1] = "https://127.0.0.1:0"
    code, err = _serve(tmp_path, *args)
    assert code == 1
    assert err == [
        f"torchbay: error: cannot read TLS file {tmp_path}/cert.pem: no such file or directory"
    ]
    (tmp_path / "cert.pem").write_text("not a certificate\n")
    code, err = _serve(tmp_path, *args)
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith("torchbay: error: cannot use TLS certificate")
    assert not (tmp_path / "key_file.json").exists()


def test_an_encrypted_tls_key_is_one_line_and_no_password_prompt(tmp_path, model_store):
    # OpenSSL prompted "Enter PEM pass phrase:" (twice without a terminal, then the start failed
    # with 'not a PEM certificate and its private key'; with one, the start waited for typing).
    from cryptography.hazmat.primitives import serialization

    from .test_grpc import _self_signed

    key, cert = _self_signed(tmp_path)
    private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    locked = serialization.BestAvailableEncryption(b"secret")
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8, locked))  # fmt: skip
    tls = tmp_path / "tls.properties"
    tls.write_text(f"private_key_file={key}\ncertificate_file={cert}\n")
    args = ["--model-store", str(model_store), "--ts-config", str(tls), *_addresses()]
    args[args.index("--inference-address") + 1] = "https://127.0.0.1:0"
    code, err = _serve(tmp_path, *args)
    assert code == 1
    assert err == [
        f"torchbay: error: TLS key {key} is encrypted: private_key_file must be an unencrypted "
        "PEM key (e.g. openssl pkey -in KEY -out PLAIN_KEY)"
    ]


def test_a_ready_file_in_a_missing_folder_is_one_line_before_anything_starts(tmp_path, model_store):
    ready = tmp_path / "nowhere" / "ready.json"
    args = ["--model-store", str(model_store), "--ready-file", str(ready), *_addresses()]
    code, err = _serve(tmp_path, *args)
    assert code == 1
    assert err == [
        f"torchbay: error: cannot write --ready-file {ready}: folder {ready.parent} does not exist"
    ]
    assert not (tmp_path / "key_file.json").exists()  # refused before the server started


def test_bad_configuration_is_one_line_per_field_and_exit_2(tmp_path, model_store):
    # A typed value (here the environment) is refused; config.properties' bad values warn and
    # keep their default, except where that is not safe (config/lenient.py): those refuse too.
    config = tmp_path / "config.properties"
    config.write_text("batch_size=8\n")
    args = ["--model-store", str(model_store), "--ts-config", str(config), *_addresses()]
    code, err = _serve(tmp_path, *args, env={"TORCHBAY_MAX_BATCH_DELAY": "inf"})
    assert code == 2
    assert err == [
        "torchbay: invalid configuration: max_batch_delay_ms: Input should be a finite number "
        "(got 'inf')"
    ]
    config.write_text("max_batch_delay=inf\nbatch_size=0\nmodels={not json\n")
    code, err = _serve(tmp_path, *args)
    assert code == 2 and len(err) == 1 and "models=" in err[0], err
    config.write_text("max_batch_delay=inf\nallowed_urls=file://(\nenable_grpc_ssl=maybe\n")
    code, err = _serve(tmp_path, *args)
    assert code == 2 and len(err) == 2, err
    assert all(line.startswith("torchbay: invalid configuration: ") for line in err)
    assert any("allowed_urls: " in line and "bad regex" in line for line in err)
    # A traceback stays one switch away, for debugging.
    code, err = _serve(tmp_path, *args, env={"TORCHBAY_DEBUG": "1"})
    assert code != 0 and "Traceback (most recent call last):" in err


@contextlib.contextmanager
def _held_start(model_store: Path) -> Iterator[tuple[LiveServer, threading.Event]]:
    """A server starting with probe.mar from a URL, whose download the origin holds until the
    event yielded is set: the start-up window, held open (the server, the event)."""
    asked, gate = threading.Event(), threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            asked.set()
            gate.wait(60)
            body = (model_store / "probe.mar").read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    origin = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=origin.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{origin.server_address[1]}"
    allowed = [re.escape(base) + "/.*"]
    live = LiveServer(
        make_config(model_store, load_models=[f"{base}/probe.mar"], allowed_urls=allowed)
    )
    threading.Thread(target=live.start, daemon=True).start()
    try:
        until(asked.is_set, "the start-up model's download", timeout=120)
        yield live, gate
    finally:
        gate.set()
        live.stop()
        origin.shutdown()
        origin.server_close()


def test_ping_is_unhealthy_until_the_start_up_models_are_in(model_store):
    # A start-up model still on its way (here its download, held by the origin): /ping
    # answered 200 Healthy (no default version to count yet) while its requests were 404
    # ModelNotFound, so a load balancer or SageMaker routed traffic to a restarting server.
    # TorchServe listens only once its models are in; /v2/health/ready was already 503.
    with _held_start(model_store) as (live, gate):
        ping = httpx.get(f"{live.url}/ping", timeout=30)
        assert (ping.status_code, ping.json()) == (500, {"status": "Unhealthy"})
        gate.set()
        assert live.server.state.started.wait(120)
        ping = httpx.get(f"{live.url}/ping", timeout=30)
        assert (ping.status_code, ping.json()) == (200, {"status": "Healthy"})


def test_a_request_for_a_model_not_in_yet_at_start_up_is_a_503_not_a_404(model_store):
    # Its requests were 404 Model not found for as long as the archive took to come in (a
    # restart from the snapshot: seconds of 404s, which clients do not retry).
    with _held_start(model_store) as (live, gate):
        r = httpx.post(f"{live.url}/predictions/probe", json={}, timeout=30)
        assert r.status_code == 503, r.text
        assert r.json()["message"] == "Model 'probe' is not loaded yet: the server is starting"
        v2 = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}
        r = httpx.post(f"{live.url}/v2/models/probe/infer", json=v2, timeout=30)
        assert r.status_code == 503, r.text
        gate.set()
        assert live.server.state.started.wait(120)
        r = httpx.post(f"{live.url}/predictions/probe", json={}, timeout=30)
        assert r.status_code == 200, r.text
        r = httpx.post(f"{live.url}/predictions/nope", json={}, timeout=30)
        assert r.status_code == 404, r.text  # once started, an unknown model is a 404 again
