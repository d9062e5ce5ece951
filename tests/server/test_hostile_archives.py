"""Hostile archives and URLs against a live server (real uvicorn, real workers, the real
management API): traversal manifests, zip/tar bombs, links, absolute members, bad names and
URLs are refused with a clear 4xx at start-up and through ``POST /models``; nothing lands
outside the work folder, no download is left behind, no message holds a filesystem path, and
the server keeps serving its other model."""

from __future__ import annotations

import functools
import io
import json
import re
import shutil
import stat
import struct
import tarfile
import threading
import uuid
import zipfile
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.tarballs import write_tar_with_link

MIB = 1 << 20
MARKER = f"pwned{uuid.uuid4().hex[:8]}"
TINY_INPUT = bytes(256)  # 64 float32 zeros for the tensor handler


def _manifest(**model: Any) -> str:
    fields = {"modelName": "evil", "modelVersion": "1.0", "handler": "tensor", **model}
    return json.dumps({"runtime": "python", "model": fields})


def _zip(path: Path, members: dict[str, bytes], man: str) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("MAR-INF/MANIFEST.json", man)
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _lie(path: Path, member: str, declared: int) -> None:
    """Patch the local and central headers of ``member`` to declare ``declared`` bytes."""
    _patch(path, member, (22, 24), struct.pack("<I", declared))


def _patch(path: Path, member: str, at: tuple[int, int], value: bytes) -> None:
    """Write ``value`` at offset ``at[0]`` of ``member``'s local header and ``at[1]`` of its
    central one."""
    raw = bytearray(path.read_bytes())
    for sig, field_at, name_at in ((b"PK\x03\x04", at[0], 30), (b"PK\x01\x02", at[1], 46)):
        start = 0
        while (found := raw.find(sig, start)) >= 0:
            start = found + 4
            if raw[found + name_at : found + name_at + len(member)] == member.encode():
                raw[found + field_at : found + field_at + len(value)] = value
    path.write_bytes(bytes(raw))


def _garble(path: Path, member: str) -> Path:
    """Overwrite ``member``'s compressed bytes with 0xff (a reserved deflate block type)."""
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
    at = info.header_offset
    name_len, extra_len = struct.unpack("<HH", raw[at + 26 : at + 30])
    start = at + 30 + name_len + extra_len
    raw[start : start + info.compress_size] = b"\xff" * info.compress_size
    path.write_bytes(bytes(raw))
    return path


def _corrupt_archives(root: Path) -> dict[str, str]:
    """Archives whose bytes are damaged or that zipfile cannot read (zlib, gzip and zipfile
    raise their own errors on them): each is a 400 that says it is corrupt."""
    man = _manifest(modelName="broken")
    _garble(_zip(root / "garbled-manifest.mar", {}, man), "MAR-INF/MANIFEST.json")
    _garble(_zip(root / "garbled-member.mar", {"model.pt": bytes(4096)}, man), "model.pt")
    # compression method 99 (AES), which zipfile does not read
    _patch(_zip(root / "method.mar", {}, man), "MAR-INF/MANIFEST.json", (8, 10), b"\x63\x00")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("broken/MAR-INF/MANIFEST.json")
        info.size = len(man)
        tf.addfile(info, io.BytesIO(man.encode()))
    (root / "truncated.tar.gz").write_bytes(buf.getvalue()[:40])  # cut in its first block
    names = ("garbled-manifest.mar", "garbled-member.mar", "method.mar", "truncated.tar.gz")
    return dict.fromkeys(names, "corrupt") | _deep_archives(root)


def _deep_archives(root: Path) -> dict[str, str]:
    """A manifest and a model-config.yaml nested past the parsers' recursion limits (stored,
    not deflated: under the compression-ratio limit)."""
    deep = "[" * 100_000
    with zipfile.ZipFile(root / "deep-manifest.mar", "w") as zf:
        zf.writestr("MAR-INF/MANIFEST.json", deep)
    with zipfile.ZipFile(root / "deep-config.mar", "w") as zf:
        zf.writestr("MAR-INF/MANIFEST.json", _manifest(configFile="model-config.yaml"))
        zf.writestr("model-config.yaml", deep)
    return dict.fromkeys(("deep-manifest.mar", "deep-config.mar"), "nested too deep")


# archive name -> (how it is built, a fragment of the refusal message)
TRAVERSAL = {
    "version.mar": ({"modelVersion": f"../../{MARKER}"}, "modelVersion"),
    "name-slash.mar": ({"modelName": f"a/../../{MARKER}"}, "modelName"),
    "name-newline.mar": ({"modelName": "evil\n"}, "modelName"),
    "serialized-abs.mar": ({"serializedFile": "/etc/passwd"}, "serializedFile"),
    "handler-dots.mar": ({"handler": f"../../{MARKER}.py"}, "handler"),
    "model-file.mar": ({"modelFile": f"../{MARKER}.py"}, "modelFile"),
    "config-file.mar": ({"configFile": "../../../etc/passwd"}, "configFile"),
    "extra-files.mar": ({"extraFiles": ["ok.txt", f"../../{MARKER}"]}, "extraFiles"),
}


def _build_store(root: Path, tiny: Path) -> dict[str, str]:
    """Write the hostile archives next to a good ``tiny.mar``; returns name -> expected reason."""
    shutil.copy(tiny, root / "tiny.mar")
    expected = {}
    for name, (fields, why) in TRAVERSAL.items():
        _zip(root / name, {"model.pt": b"x"}, _manifest(**fields))
        expected[name] = why
    zeros = {f"w{i}.bin": bytes(8 * MIB) for i in range(4)}  # each under the 20 MiB total
    _zip(root / "bomb.mar", zeros, _manifest(modelName="bomb"))
    expected["bomb.mar"] = "compression ratio"
    _lie(
        _zip(root / "liar.mar", {"w.bin": bytes(64 * MIB)}, _manifest(modelName="liar")),
        "w.bin",
        10,
    )
    expected["liar.mar"] = "w.bin"
    with tarfile.open(root / "bomb.tar.gz", "w:gz") as tf:
        members = {"MAR-INF/MANIFEST.json": _manifest(modelName="tbomb").encode(), **zeros}
        for name, data in members.items():
            info = tarfile.TarInfo(f"tbomb/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    expected["bomb.tar.gz"] = "compression ratio"
    with zipfile.ZipFile(root / "link.mar", "w") as zf:
        zf.writestr("MAR-INF/MANIFEST.json", _manifest(modelName="link"))
        info = zipfile.ZipInfo("model.pt")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, "/etc/passwd")
    expected["link.mar"] = "symlink"
    write_tar_with_link(
        root / "hardlink.tar.gz", "hard", _manifest(modelName="hard"), tarfile.LNKTYPE
    )
    expected["hardlink.tar.gz"] = "link"
    with zipfile.ZipFile(root / "abs-member.mar", "w") as zf:
        zf.writestr("MAR-INF/MANIFEST.json", _manifest(modelName="absm"))
        zf.writestr(zipfile.ZipInfo(f"/abs/{MARKER}.py"), b"x")
    expected["abs-member.mar"] = "absolute"
    return {**expected, **_corrupt_archives(root)}


class FileOrigin:
    """A static HTTP server over one folder on 127.0.0.1 port 0; records the paths asked for."""

    def __init__(self, folder: Path) -> None:
        self.seen: list[str] = []
        seen = self.seen

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                seen.append(self.path)
                super().do_GET()

        handler = functools.partial(Handler, directory=str(folder))
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def hostile(model_store: Path, tmp_path: Path) -> Iterator[tuple[Path, dict[str, str], FileOrigin]]:
    store = tmp_path / "store"
    store.mkdir()
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "creds.mar").write_bytes(b"never served")
    expected = _build_store(store, model_store / "tiny.mar")
    origin = FileOrigin(tmp_path)
    yield store, expected, origin
    origin.close()


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _no_marker(*roots: Path) -> None:
    for root in roots:
        assert not list(root.glob(f"*{MARKER}*")), f"something was written under {root}"


@pytest.mark.slow
def test_hostile_archives_refused_at_startup_and_through_the_api(live_server, hostile, tmp_path):
    store, expected, origin = hostile
    before = _tree(tmp_path)
    startup = ["version.mar", "serialized-abs.mar", "bomb.mar", "liar.mar", "truncated.tar.gz"]
    server = live_server(
        model_store=store,
        load_models=["tiny.mar", *startup],
        enable_model_api=True,
        allowed_urls=[re.escape(origin.base) + r"/store/[^/]+"],
        max_archive_expanded_size=20 * MIB,
        max_archive_compression_ratio=100,
    )
    registry = server.server.registry
    workdir = registry.workdir
    # Start-up: the hostile models are refused with the reason logged; tiny loads.
    failed = server.server.state.failed_models
    assert set(failed) == set(startup), failed
    for name in startup:
        assert expected[name] in failed[name], (name, failed[name])
    secrets = (str(tmp_path), str(workdir), "/tmp/")
    with httpx.Client(base_url=server.management_url, timeout=60) as m:
        for name, why in expected.items():  # from the model store
            r = m.post("/models", params={"url": name, "initial_workers": 0})
            assert r.status_code == 400, (name, r.text)
            assert why in r.json()["message"], (name, r.text)
            assert not any(s in r.text for s in secrets), r.text
        for name in ("bomb.mar", "liar.mar", "bomb.tar.gz", "version.mar", "link.mar"):
            r = m.post("/models", params={"url": f"{origin.base}/store/{name}"})
            assert r.status_code == 400, (name, r.text)
            assert not any(s in r.text for s in secrets), r.text
        for url in (  # dot-segments and encodings cannot reach outside /store/
            f"{origin.base}/store/../secret/creds.mar",
            f"{origin.base}/store/%2e%2e/secret/creds.mar",
            f"{origin.base}/store/..%2fsecret%2fcreds.mar",
        ):
            r = m.post("/models", params={"url": url})
            assert r.status_code == 403 and r.json()["type"] == "UrlNotAllowed", r.text
        for store_url in ("tiny.mar\x00.txt", "../store/tiny.mar\n"):
            r = m.post("/models", params={"url": store_url})
            assert r.status_code == 400, (store_url, r.text)
        for bad_name in ("tiny2\n", "../tiny2", "a/b"):
            r = m.post("/models", params={"url": "tiny.mar", "model_name": bad_name})
            assert r.status_code == 400, (bad_name, r.text)
        assert [x["modelName"] for x in m.get("/models").json()["models"]] == ["tiny"]
    assert not any("secret" in p for p in origin.seen), origin.seen
    # Nothing outside the store or the work folder; no download or half-extracted model kept.
    assert _tree(tmp_path) == before
    _no_marker(workdir, workdir.parent, workdir.parent.parent, store, store.parent)
    downloads = workdir / "downloads"
    assert not downloads.exists() or list(downloads.iterdir()) == []
    [model_dir] = [p for p in workdir.iterdir() if p.name != "downloads"]
    assert model_dir.name.startswith("tiny-1.0-")
    r = httpx.post(
        f"{server.url}/predictions/tiny",
        content=TINY_INPUT,
        headers={"content-type": "application/octet-stream"},
        timeout=60,
    )
    assert r.status_code == 200, r.text


@pytest.mark.slow
def test_downloaded_archive_removed_after_registration(live_server, hostile, tmp_path):
    store, _, origin = hostile
    server = live_server(
        model_store=store,
        enable_model_api=True,
        allowed_urls=[re.escape(origin.base) + r"/store/[^/]+"],
    )
    workdir = server.server.registry.workdir
    r = httpx.post(
        f"{server.management_url}/models",
        params={"url": f"{origin.base}/store/tiny.mar", "initial_workers": 0},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert list((workdir / "downloads").iterdir()) == []  # unpacked, then removed
    [model_dir] = [p for p in workdir.iterdir() if p.name != "downloads"]
    assert (model_dir / "MAR-INF" / "MANIFEST.json").is_file()
