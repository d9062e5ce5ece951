"""Token authorization: the key file, the auth matrix over every route of every port, rotation,
expiry, and the key file's removal at shutdown."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import httpx
import pytest

from torchbay.server.errors import BadRequest, ConfigError, Unauthorized
from torchbay.server.http.auth import TokenAuth

from .conftest import LiveServer, make_config

TINY = bytes(256)  # 64 float32 zeros for the tensor handler
RECORDED_TOKENS = Path(__file__).parents[1] / "data/torchserve/health_tokens/answers.json"
V2_BODY = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_keys_expire_rotate_and_compare_exactly(tmp_path):
    clock = Clock()
    auth = TokenAuth(tmp_path / "keys.json", expiration_min=1, clock=clock)
    key = auth.keys["management"].value
    auth.check(f"Bearer {key}", "management")
    auth.check(f"bearer {key}".encode(), "management")
    for bad in (None, key, f"Bearer {key}x", f"Bearer {key[:-1]}", "Bearer ", f"Basic {key}"):
        with pytest.raises(Unauthorized):
            auth.check(bad, "management")
    with pytest.raises(Unauthorized):  # the right key of another kind
        auth.check(f"Bearer {auth.keys['inference'].value}", "management")
    clock.now += 61
    with pytest.raises(Unauthorized, match="expired"):
        auth.check(f"Bearer {key}", "management")
    api_key = auth.keys["API"].value
    auth.check(f"Bearer {api_key}", "API")  # the API key never expires
    fresh = auth.rotate("management")["management"]["key"]
    assert fresh != key
    auth.check(f"Bearer {fresh}", "management")
    with pytest.raises(BadRequest):
        auth.rotate("API")
    on_disk = json.loads((tmp_path / "keys.json").read_text())
    assert on_disk["management"]["key"] == fresh


def test_a_server_deletes_only_the_key_file_it_wrote(tmp_path):
    path = tmp_path / "key_file.json"
    never_wrote = TokenAuth(path, expiration_min=1)
    first = TokenAuth(path, expiration_min=1)
    first.write_key_file()
    assert never_wrote.delete_key_file() is False  # a failed start wrote nothing: deletes nothing
    assert json.loads(path.read_text()) == first.key_file_json()

    second = TokenAuth(path, expiration_min=1)  # another server on the same path
    second.write_key_file()
    assert first.delete_key_file() is False  # not first's keys any more
    assert json.loads(path.read_text()) == second.key_file_json()

    second.rotate("inference")  # rewritten by its owner: still its own
    assert second.delete_key_file() is True
    assert not path.exists()
    assert second.delete_key_file() is False  # already gone


@pytest.mark.slow
def test_auth_matrix_rotation_and_key_file_lifecycle(model_store, tmp_path):
    key_file = tmp_path / "run" / "key_file.json"
    server = LiveServer(
        make_config(
            model_store,
            load_models=["tiny=tiny.mar"],
            disable_token_authorization=False,
            enable_model_api=True,
            key_file=key_file,
        )
    ).start()
    try:
        _check_key_file(key_file)
        keys = json.loads(key_file.read_text())
        _matrix(server, keys)
        _rotation(server, key_file, keys)
    finally:
        server.stop()
    assert not key_file.exists()  # deleted at shutdown, as TorchServe does


def _check_key_file(key_file: Path) -> None:
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    keys = json.loads(key_file.read_text())
    assert set(keys) == {"management", "inference", "API"}
    assert set(keys["management"]) == {"key", "expiration time"}
    assert set(keys["inference"]) == {"key", "expiration time"}
    assert set(keys["API"]) == {"key"}
    assert len({keys[k]["key"] for k in keys}) == 3


def _matrix(server: LiveServer, keys: dict) -> None:
    inf, mgmt = server.url, server.management_url
    # (method, url, kwargs, key kind, status with the right key)
    protected = [
        ("POST", f"{inf}/predictions/tiny", {"content": TINY}, "inference", 200),
        ("PUT", f"{inf}/predictions/tiny/1.0", {"content": TINY}, "inference", 200),
        ("POST", f"{inf}/explanations/tiny", {"content": TINY}, "inference", 501),  # no explain
        ("POST", f"{inf}/predictions/nope", {"content": TINY}, "inference", 404),
        ("GET", f"{inf}/v2/models/tiny", {}, "inference", 200),
        ("GET", f"{inf}/v2/models/tiny/versions/1.0", {}, "inference", 200),
        ("GET", f"{inf}/v2/models/tiny/ready", {}, "inference", 200),
        ("POST", f"{inf}/v2/models/tiny/infer", {"json": V2_BODY}, "inference", 200),
        ("GET", f"{inf}/v1/models", {}, "inference", 200),
        ("GET", f"{inf}/v2/models", {}, "inference", 200),
        ("GET", f"{inf}/v1/models/tiny", {}, "inference", 200),
        ("GET", f"{mgmt}/models", {}, "management", 200),
        ("GET", f"{mgmt}/models/tiny", {}, "management", 200),
        ("GET", f"{mgmt}/models/tiny/all", {}, "management", 200),
        ("GET", f"{mgmt}/v1/models/tiny", {}, "management", 200),
        ("PUT", f"{mgmt}/models/tiny", {"params": {"batch_size": 1}}, "management", 202),
        ("PUT", f"{mgmt}/models/tiny/1.0/set-default", {}, "management", 200),
        ("POST", f"{mgmt}/models", {"params": {"url": "none.mar"}}, "management", 404),
        ("DELETE", f"{mgmt}/models/nope", {}, "management", 404),
        ("DELETE", f"{mgmt}/models/tiny/9.9", {}, "management", 404),
        ("GET", f"{mgmt}/token", {"params": {"type": "inference"}}, "API", 200),
    ]
    other = {"inference": "management", "management": "inference", "API": "management"}
    with httpx.Client(timeout=60) as client:
        for method, url, kwargs, kind, ok in protected:
            right = keys[kind]["key"]
            for label, headers in (
                ("no token", {}),
                ("wrong token", {"Authorization": "Bearer not-a-key"}),
                ("other kind", {"Authorization": f"Bearer {keys[other[kind]]['key']}"}),
                ("no scheme", {"Authorization": right}),
            ):
                r = client.request(method, url, headers=headers, **kwargs)
                assert r.status_code == 401, (method, url, label, r.text)
                body = r.json()  # OIP routes answer OIP's {"error": ...} shape
                assert body.get("type") == "Unauthorized" or "error" in body, (url, label)
                assert r.headers["www-authenticate"] == "Bearer"
            if kind == "API":
                continue  # rotating the inference key would spoil the rows after it
            r = client.request(method, url, headers={"Authorization": f"Bearer {right}"}, **kwargs)
            assert r.status_code == ok, (method, url, r.text)
        # Open routes: health, metrics, API descriptions.
        for url in (
            f"{inf}/ping",
            f"{inf}/",  # KServe v1 liveness
            f"{inf}/v2/health/live",
            f"{inf}/v2/health/ready",
            f"{server.metrics_url}/metrics",
            f"{inf}/openapi.json",
            f"{mgmt}/openapi.json",
            f"{server.metrics_url}/openapi.json",
        ):
            assert client.get(url).status_code == 200, url
        for base in (inf, mgmt, server.metrics_url):
            assert client.request("OPTIONS", f"{base}/").status_code == 200, base
        bases = {"inference": inf, "management": mgmt, "metrics": server.metrics_url}
        _open_calls_against_torchserve(client, bases)


def _open_calls_against_torchserve(client: httpx.Client, bases: dict[str, str]) -> None:
    """TorchServe 0.12 (tests/data/torchserve/health_tokens) wants the inference key on /ping
    (and on /v2/health/*, which it does not serve) and refuses a missing key with 400
    InvalidKeyException. torchbay leaves health open (a probe carries no rotating key) and
    refuses with 401: two rows of README's differences. OPTIONS and /metrics: open in both."""
    for row in json.loads(RECORDED_TOKENS.read_text())["answers"]:
        method, listener, path = row["call"].split()
        ours, theirs = client.request(method, bases[listener] + path), row["none"]
        if path in ("/ping", "/v2/health/live", "/v2/health/ready"):
            assert (theirs[0], ours.status_code) == (400, 200), row["call"]
        elif theirs[0] == 400:
            assert (theirs[1]["type"], ours.status_code) == ("InvalidKeyException", 401), row
        else:
            assert theirs[0] == ours.status_code == 200, row["call"]


def _rotation(server: LiveServer, key_file: Path, keys: dict) -> None:
    old = keys["management"]["key"]
    api = {"Authorization": f"Bearer {keys['API']['key']}"}
    with httpx.Client(base_url=server.management_url, timeout=60) as client:
        r = client.get("/token", params={"type": "management"}, headers=api)
        assert r.status_code == 200, r.text
        new = r.json()["management"]["key"]
        assert new != old and "expiration time" in r.json()["management"]
        assert json.loads(key_file.read_text())["management"]["key"] == new
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        assert client.get("/models", headers={"Authorization": f"Bearer {old}"}).status_code == 401
        assert client.get("/models", headers={"Authorization": f"Bearer {new}"}).status_code == 200
        bad = client.get("/token", params={"type": "API"}, headers=api)
        assert bad.status_code == 400
        # The inference key rotates the same way and the old one stops working at once.
        old_inf = json.loads(key_file.read_text())["inference"]["key"]
        new_inf = client.get("/token", params={"type": "inference"}, headers=api).json()
        new_inf = new_inf["inference"]["key"]
    predict = f"{server.url}/predictions/tiny"
    old_h = {"Authorization": f"Bearer {old_inf}"}
    assert httpx.post(predict, content=TINY, headers=old_h).status_code == 401
    new_h = {"Authorization": f"Bearer {new_inf}"}
    assert httpx.post(predict, content=TINY, headers=new_h).status_code == 200


@pytest.mark.slow
def test_auth_disabled_needs_no_key_and_writes_no_file(live_server, tmp_path):
    key_file = tmp_path / "key_file.json"
    server = live_server(key_file=key_file)  # the fixture's default: token auth off
    assert not key_file.exists()
    assert httpx.get(f"{server.management_url}/models").status_code == 200
    r = httpx.get(f"{server.management_url}/token", params={"type": "management"})
    assert r.status_code == 404


def test_operator_provided_keys_are_used_as_they_are(model_store, tmp_path):
    """token_keys_file (a mounted Kubernetes Secret): the same keys on every replica, never
    expiring, never written over, deleted or rotated by the server."""
    keys = {
        "management": {"key": "m" * 24},
        "inference": {"key": "i" * 24},
        "API": {"key": "a" * 24},
    }
    keys_file = tmp_path / "secret" / "keys.json"
    keys_file.parent.mkdir()
    keys_file.write_text(json.dumps(keys))
    key_file = tmp_path / "key_file.json"
    config = make_config(
        model_store,
        load_models=["tiny=tiny.mar"],
        disable_token_authorization=False,
        token_keys_file=keys_file,
        key_file=key_file,
        token_expiration_min=1e-6,  # ignored for provided keys: they never expire
    )
    server = LiveServer(config).start()
    try:
        _provided_keys_work(server)
    finally:
        server.stop()
    assert not key_file.exists()  # nothing written
    assert json.loads(keys_file.read_text()) == keys  # the operator's file is untouched


def _provided_keys_work(server: LiveServer) -> None:
    body = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}
    infer = f"{server.url}/v2/models/tiny/infer"
    assert httpx.post(infer, json=body, timeout=30).status_code == 401
    good = httpx.post(infer, json=body, headers={"Authorization": "Bearer " + "i" * 24}, timeout=30)
    assert good.status_code == 200, good.text
    management = {"Authorization": "Bearer " + "m" * 24}
    assert httpx.get(f"{server.management_url}/models", headers=management).status_code == 200
    rotate = httpx.get(
        f"{server.management_url}/token",
        params={"type": "inference"},
        headers={"Authorization": "Bearer " + "a" * 24},
    )
    assert rotate.status_code == 400 and "token_keys_file" in rotate.json()["message"]


@pytest.mark.parametrize(
    "content", ["{not json", '{"management": {"key": "short"}}', json.dumps({"API": {}})]
)
def test_unusable_provided_keys_are_a_config_error(tmp_path, content):
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(content)
    with pytest.raises(ConfigError, match="token_keys_file"):
        TokenAuth(tmp_path / "key_file.json", 60, keys_file=keys_file)


def test_a_rotation_whose_key_file_cannot_be_written_keeps_the_old_key(model_store, tmp_path):
    run = tmp_path / "run"
    key_file = run / "key_file.json"
    config = make_config(model_store, disable_token_authorization=False, key_file=key_file)
    server = LiveServer(config).start()
    try:
        keys = json.loads(key_file.read_text())
        api = {"Authorization": f"Bearer {keys['API']['key']}"}
        old = {"Authorization": f"Bearer {keys['management']['key']}"}
        key_file.unlink()
        run.rmdir()
        run.write_text("not a folder")  # the key file cannot be written now
        with httpx.Client(base_url=server.management_url, timeout=60) as client:
            r = client.get("/token", params={"type": "management"}, headers=api)
            assert r.status_code == 503, r.text  # was: 500, and the new key lost with it
            assert "not rotated" in r.json()["message"] and str(tmp_path) not in r.text
            assert client.get("/models", headers=old).status_code == 200  # the old key holds
            run.unlink()
            r = client.get("/token", params={"type": "management"}, headers=api)
            assert r.status_code == 200, r.text
            new = {"Authorization": f"Bearer {r.json()['management']['key']}"}
            assert client.get("/models", headers=new).status_code == 200
            assert client.get("/models", headers=old).status_code == 401
    finally:
        server.stop()
