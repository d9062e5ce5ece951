"""allowed_urls and the download guard (CVE-2023-43654, "ShellTorch" SSRF), against a local HTTP
server on port 0: off-list URLs and redirects are never requested, downloads are capped in size
and time, and an allowed archive registers through the management API."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from torchbay.server.errors import BadRequest, PayloadTooLarge, RequestTimeout
from torchbay.server.serving.fetch import Fetcher, UrlNotAllowed


class Origin:
    """A tiny HTTP server: /archive/<file> from a folder, redirects, big and slow bodies."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.seen: list[str] = []
        origin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                origin.seen.append(self.path)
                if self.path.startswith("/archive/"):
                    data = (origin.folder / self.path.rsplit("/", 1)[1]).read_bytes()
                    self._send(200, data)
                elif self.path.startswith("/redirect-ok"):
                    self._redirect("/archive/probe.mar")
                elif self.path.startswith("/redirect-off"):
                    self._redirect(f"http://localhost:{origin.port}/internal/secret.mar")
                elif self.path.startswith("/redirect-dots"):
                    self._redirect("/archive/../internal/secret.mar")
                elif self.path.startswith("/redirect-encoded"):
                    self._redirect(f"{origin.base}/archive/%2e%2e/internal/secret.mar")
                elif self.path.startswith("/redirect-loop"):
                    self._redirect("/redirect-loop")
                elif self.path.startswith("/big-declared"):
                    self._send(200, bytes(4096))
                elif self.path.startswith("/big-chunked"):
                    self.send_response(200)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for _ in range(8):
                        self.wfile.write(b"400\r\n" + bytes(1024) + b"\r\n")
                    self.wfile.write(b"0\r\n\r\n")
                elif self.path.startswith("/slow"):
                    time.sleep(3)
                    self._send(200, b"late")
                else:
                    self._send(404, b"no")

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _redirect(self, location: str) -> None:
                self.send_response(302)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def allowed(self) -> list[str]:
        """Everything on this origin's 127.0.0.1 address, nothing on "localhost"."""
        return [re.escape(self.base) + r"/.*"]


@pytest.fixture
def origin(versioned_store: Path) -> Iterator[Origin]:
    server = Origin(versioned_store)
    server.thread.start()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


def fetch(fetcher: Fetcher, url: str) -> Path:
    return asyncio.run(fetcher(url))


def test_allowed_download_and_redirect_on_the_list(origin, versioned_store, tmp_path):
    fetcher = Fetcher(origin.allowed(), tmp_path / "dl")
    path = fetch(fetcher, f"{origin.base}/archive/probe.mar")
    assert path.parent == tmp_path / "dl" and path.name.endswith("probe.mar")
    assert path.read_bytes() == (versioned_store / "probe.mar").read_bytes()
    again = fetch(fetcher, f"{origin.base}/redirect-ok")
    assert again != path and again.read_bytes() == path.read_bytes()
    assert origin.seen == ["/archive/probe.mar", "/redirect-ok", "/archive/probe.mar"]


def test_urls_off_the_list_are_never_requested(origin, tmp_path):
    exact = Fetcher([re.escape(f"{origin.base}/archive/probe.mar")], tmp_path)
    for url in (
        f"{origin.base}/archive/probe.mar?x=1",  # the regex must match the whole URL
        f"{origin.base}/archive/tiny.mar",
        f"http://localhost:{origin.port}/archive/probe.mar",
        f"file://{tmp_path}/x.mar",
        "ftp://127.0.0.1/x.mar",
    ):
        with pytest.raises(UrlNotAllowed):
            fetch(exact, url)
    with pytest.raises(UrlNotAllowed, match="disabled"):  # the default: no URL at all
        fetch(Fetcher([], tmp_path), f"{origin.base}/archive/probe.mar")
    assert origin.seen == []


def test_redirect_off_the_list_is_refused_before_following(origin, tmp_path):
    fetcher = Fetcher(origin.allowed(), tmp_path / "dl")
    with pytest.raises(UrlNotAllowed, match="localhost"):
        fetch(fetcher, f"{origin.base}/redirect-off")
    assert origin.seen == ["/redirect-off"]  # /internal/secret.mar never requested
    with pytest.raises(BadRequest, match="redirects"):
        fetch(
            Fetcher(origin.allowed(), tmp_path / "dl", max_redirects=3),
            f"{origin.base}/redirect-loop",
        )
    assert origin.seen.count("/redirect-loop") == 4
    assert list((tmp_path / "dl").iterdir()) == []


def test_dot_segments_and_encodings_cannot_escape_the_allowed_prefix(origin, tmp_path):
    allowed = [re.escape(origin.base) + r"/(archive/[^/]+|redirect-[a-z]+)"]
    fetcher = Fetcher(allowed, tmp_path / "dl")
    for url in (
        f"{origin.base}/archive/../internal/secret.mar",
        f"{origin.base}/archive/./../internal/secret.mar",
        f"{origin.base}/archive/%2e%2e/internal/secret.mar",
        f"{origin.base}/archive/%2E./internal/secret.mar",
        f"{origin.base}/archive/..%2finternal%2Fsecret.mar",
        f"{origin.base}/archive/..%5cinternal%5csecret.mar",
        f"{origin.base}/archive/..\\internal\\secret.mar",
        f"{origin.base}/archive/secret.mar%00.mar",
        f"{origin.base}/archive/x.mar\n",
        f"http://user@127.0.0.1:{origin.port}/archive/probe.mar",
        f"http://127.0.0.1:{origin.port}@localhost:{origin.port}/archive/probe.mar",
    ):
        with pytest.raises(UrlNotAllowed):
            fetch(fetcher, url)
    for hop in ("/redirect-dots", "/redirect-encoded"):  # every redirect hop is normalised too
        with pytest.raises(UrlNotAllowed):
            fetch(fetcher, f"{origin.base}{hop}")
    assert origin.seen == ["/redirect-dots", "/redirect-encoded"]
    assert not (tmp_path / "dl").exists() or list((tmp_path / "dl").iterdir()) == []


def test_equivalent_spellings_are_normalised_then_allowed(origin, versioned_store, tmp_path):
    fetcher = Fetcher([re.escape(origin.base) + r"/archive/probe\.mar"], tmp_path / "dl")
    upper = f"HTTP://127.0.0.1:{origin.port}/archive/./%70robe.mar"
    path = fetch(fetcher, upper)
    assert path.read_bytes() == (versioned_store / "probe.mar").read_bytes()
    assert origin.seen == ["/archive/probe.mar"]  # the normalised URL is the one requested


def test_oversized_and_slow_downloads_stop_and_leave_nothing(origin, tmp_path):
    small = Fetcher(origin.allowed(), tmp_path / "dl", max_bytes=2048)
    with pytest.raises(PayloadTooLarge):
        fetch(small, f"{origin.base}/big-declared")
    with pytest.raises(PayloadTooLarge):  # no Content-Length: counted while streaming
        fetch(small, f"{origin.base}/big-chunked")
    with pytest.raises(RequestTimeout):
        fetch(Fetcher(origin.allowed(), tmp_path / "dl", timeout_s=0.3), f"{origin.base}/slow")
    with pytest.raises(BadRequest, match="404"):
        fetch(small, f"{origin.base}/missing.mar")
    assert list((tmp_path / "dl").iterdir()) == []


@pytest.mark.slow
def test_register_from_url_through_the_management_api(live_server, origin):
    server = live_server(enable_model_api=True, allowed_urls=origin.allowed())
    with httpx.Client(base_url=server.management_url, timeout=60) as m:
        url = f"{origin.base}/archive/probe-v2.mar"
        r = m.post("/models", params={"url": url, "initial_workers": 0})
        assert r.status_code == 200, r.text
        [described] = m.get("/models/probe").json()
        assert (described["modelUrl"], described["modelVersion"]) == (url, "2.0")
        off = m.post("/models", params={"url": f"{origin.base}/redirect-off"})
        assert off.status_code == 403 and off.json()["type"] == "UrlNotAllowed"
        other_host = f"http://localhost:{origin.port}/archive/tiny.mar"
        assert m.post("/models", json={"url": other_host}).status_code == 403
        junk = m.post("/models", params={"url": f"{origin.base}/big-declared"})
        assert junk.status_code == 400  # not an archive: the archive checks still apply
    assert "/internal/secret.mar" not in origin.seen


@pytest.mark.slow
def test_default_server_refuses_every_url(live_server, origin):
    server = live_server(enable_model_api=True)
    r = httpx.post(
        f"{server.management_url}/models", params={"url": f"{origin.base}/archive/probe.mar"}
    )
    assert r.status_code == 403 and "allowed_urls" in r.json()["message"]
    assert origin.seen == []


@pytest.mark.slow
def test_server_config_caps_url_downloads(live_server, origin):
    # max_download_size from the server's config reaches the fetcher: a real archive over it
    # is refused with 413 and nothing gets registered.
    server = live_server(enable_model_api=True, allowed_urls=origin.allowed(), max_download_size=64)
    r = httpx.post(
        f"{server.management_url}/models",
        params={"url": f"{origin.base}/archive/probe-v2.mar", "initial_workers": 0},
        timeout=60,
    )
    assert r.status_code == 413, r.text
    assert httpx.get(f"{server.management_url}/models").json()["models"] == []
