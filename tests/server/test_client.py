"""``torchbay models ...`` against a live server with token auth on: the core client, the verbs,
and one real ``python -m torchbay models list`` subprocess."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from torchbay.cli import build_parser, main
from torchbay.server.admin.client import ClientError, ManagementClient, load_token, run
from torchbay.server.errors import TorchbayError

pytestmark = pytest.mark.slow


def test_client_against_a_live_server(live_server, versioned_store, tmp_path, capsys):
    key_file = tmp_path / "key_file.json"
    server = live_server(
        model_store=versioned_store,
        disable_token_authorization=False,
        enable_model_api=True,
        key_file=key_file,
    )
    url = server.management_url
    token = load_token(None, key_file)
    assert token == json.loads(key_file.read_text())["management"]["key"]

    with ManagementClient(url, token=token) as client:
        assert client.list_models() == []
        status = client.register("tiny.mar", initial_workers=0)["status"]
        assert status == (
            'Model "tiny" Version: 1.0 registered with 0 initial workers. '
            "Use scale workers API to add workers for the model."
        )
        client.register("probe.mar", initial_workers=0)
        client.register("probe-v2.mar", initial_workers=0)
        assert [m["modelName"] for m in client.list_models()] == ["probe", "tiny"]
        assert len(client.describe("probe", "all")) == 2
        assert client.scale("tiny", min_worker=0)["status"] == "Workers scaled to 0 for model: tiny"
        client.scale("tiny", "1.0", batch_size=4)
        assert client.describe("tiny")[0]["batchSize"] == 4
        client.set_default("probe", "2.0")
        assert client.describe("probe")[0]["modelVersion"] == "2.0"
        assert client.unregister("probe", "1.0")["status"] == 'Model "probe" unregistered'
        with pytest.raises(ClientError, match="404 ModelNotFound: Model not found: nope"):
            client.describe("nope")
        with pytest.raises(ClientError, match="409"):
            client.register("tiny.mar", initial_workers=0)

    with pytest.raises(ClientError, match="401 Unauthorized"), ManagementClient(url) as anon:
        anon.list_models()
    with (
        pytest.raises(ClientError, match="cannot reach"),
        ManagementClient("http://127.0.0.1:9", token=token) as dead,
    ):
        dead.list_models()
    assert issubclass(ClientError, TorchbayError)  # so the CLI prints one line and exits 1

    # The verbs, through the real argument parser.
    common = ["--url", url, "--key-file", str(key_file)]
    args = build_parser().parse_args(["models", "list", *common])
    listing = run(args)
    assert listing.splitlines()[0].split() == ["MODEL", "URL"]
    assert "probe-v2.mar" in listing and "tiny.mar" in listing
    described = run(build_parser().parse_args(["models", "describe", "probe", "--json", *common]))
    assert json.loads(described)[0]["modelVersion"] == "2.0"
    text = run(build_parser().parse_args(["models", "describe", "tiny", *common]))
    assert "1.0 (default)" in text and "STOPPED" in text  # zero workers, on request

    assert main(["models", "unregister", "nope", *common]) == 1
    assert "torchbay: error: 404 ModelNotFound" in capsys.readouterr().err
    assert main(["models", "describe", "tiny", "--token", "wrong", "--url", url]) == 1
    assert "401 Unauthorized" in capsys.readouterr().err
    assert main(["models", "list", "--url", url, "--key-file", str(tmp_path / "none")]) == 1
    assert "cannot read key file" in capsys.readouterr().err

    proc = subprocess.run(
        [sys.executable, "-m", "torchbay", "models", "list", *common, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert {m["modelName"] for m in json.loads(proc.stdout)} == {"probe", "tiny"}
    assert proc.stderr == ""  # only the result: no HTTP client log lines
