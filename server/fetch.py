"""Download a model archive from an http(s) URL, only where ``allowed_urls`` permits.

The SSRF of CVE-2023-43654 ("ShellTorch") was the register API fetching any URL. Here:

* a URL must *fully* match one of the ``allowed_urls`` regexes; none are allowed by default
  (then only the model store can be registered from);
* redirects are followed by hand, at most ``max_redirects``, and every hop is checked against
  the same list before it is requested;
* the body is streamed and counted: past ``max_bytes`` the download stops (413), and the whole
  download is bounded by ``timeout_s`` (504);
* the file lands in a private download folder under a fresh name; the registry then unpacks it
  with the same safe extraction and hash checks as a model-store archive.

Proxies and ``.netrc`` from the environment are ignored (``trust_env=False``). Torch-free.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from urllib.parse import urljoin, urlsplit

import httpx

from torchbay.server.errors import (
    BadRequest,
    Forbidden,
    PayloadTooLarge,
    RequestTimeout,
    TorchbayError,
)

log = logging.getLogger("torchbay.fetch")

DEFAULT_MAX_BYTES = 2 * 1024**3  # 2 GiB
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_MAX_REDIRECTS = 5
_REDIRECTS = (301, 302, 303, 307, 308)
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


class UrlNotAllowed(Forbidden):
    """The URL (or a redirect hop) matches none of ``allowed_urls``."""

    code = "url_not_allowed"


class Fetcher:
    """``await fetcher(url) -> Path`` of the downloaded archive (the registry's ``fetch`` hook)."""

    def __init__(
        self,
        allowed_urls: Sequence[str],
        download_dir: Path,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_redirects: int = DEFAULT_MAX_REDIRECTS,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.patterns = [re.compile(p) for p in allowed_urls]
        self.download_dir = download_dir
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.max_redirects = max_redirects
        self.transport = transport

    def check(self, url: str) -> None:
        """Raise UrlNotAllowed unless ``url`` is http(s) and fully matches an allowed regex."""
        scheme = urlsplit(url).scheme.lower()
        if scheme not in ("http", "https"):
            raise UrlNotAllowed(f"Only http(s) URLs can be downloaded, got {url!r}")
        if not self.patterns:
            raise UrlNotAllowed(
                f"Registering from a URL is disabled: {url!r} (set allowed_urls to the regexes "
                "of trusted URLs, or put the archive in the model store)"
            )
        if not any(p.fullmatch(url) for p in self.patterns):
            raise UrlNotAllowed(f"Given URL {url!r} does not match any allowed URL(s)")

    async def __call__(self, url: str) -> Path:
        self.check(url)
        self.download_dir.mkdir(parents=True, exist_ok=True)
        target = self.download_dir / f"{uuid.uuid4().hex[:12]}-{_file_name(url)}"
        try:
            await asyncio.wait_for(self._download(url, target), self.timeout_s)
        except asyncio.TimeoutError:
            target.unlink(missing_ok=True)
            raise RequestTimeout(
                f"Downloading {url!r} took longer than {self.timeout_s:g}s"
            ) from None
        except BaseException:
            target.unlink(missing_ok=True)
            raise
        return target

    async def _download(self, url: str, target: Path) -> None:
        async with httpx.AsyncClient(
            follow_redirects=False, trust_env=False, transport=self.transport, timeout=None
        ) as client:
            for _ in range(self.max_redirects + 1):
                try:
                    async with client.stream("GET", url) as response:
                        if response.status_code in _REDIRECTS:
                            location = response.headers.get("location")
                            if not location:
                                raise BadRequest(f"Redirect from {url!r} without a Location")
                            url = urljoin(url, location)
                            self.check(url)  # before the next hop is ever requested
                            continue
                        if response.status_code != 200:
                            raise BadRequest(
                                f"Failed to download {url!r}: HTTP {response.status_code}"
                            )
                        await self._save(response, url, target)
                        log.info("downloaded %s (%d bytes)", url, target.stat().st_size)
                        return
                except TorchbayError:
                    raise
                except httpx.HTTPError as exc:
                    raise BadRequest(f"Failed to download {url!r}: {exc}") from None
            raise BadRequest(f"Too many redirects (more than {self.max_redirects})")

    async def _save(self, response: httpx.Response, url: str, target: Path) -> None:
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            raise PayloadTooLarge(
                f"{url!r} is {int(declared)} bytes, over the {self.max_bytes}-byte download limit"
            )
        size = 0
        with open(target, "wb") as f:
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > self.max_bytes:  # the server may lie about or omit the length
                    raise PayloadTooLarge(
                        f"{url!r} is over the {self.max_bytes}-byte download limit"
                    )
                f.write(chunk)


def _file_name(url: str) -> str:
    """A harmless file name from the URL's last path segment (keeps the archive suffix)."""
    name = PurePosixPath(urlsplit(url).path).name or "model.mar"
    name = _SAFE_NAME.sub("_", name).lstrip(".") or "model.mar"
    return name[-100:]


def cleanup(path: Path) -> None:
    """Remove a downloaded archive (the registry unpacks it and no longer needs it)."""
    with contextlib.suppress(OSError):
        path.unlink()
