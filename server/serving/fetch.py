"""Download a model archive from an http(s) URL, only where ``allowed_urls`` permits.

The SSRF of CVE-2023-43654 ("ShellTorch") was the register API fetching any URL. Here:

* a URL is first normalised (RFC 3986: scheme and host lower-cased, percent-escapes of
  unreserved characters decoded, dot-segments removed; userinfo, backslashes, control
  characters and encoded ``/`` or ``\\`` refused), then must *fully* match one of the
  ``allowed_urls`` regexes, and the normalised URL is the one requested; none are allowed by
  default (then only the model store can be registered from);
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
import logging
import re
import uuid
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from urllib.parse import urljoin, urlsplit, urlunsplit

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
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_HOST = re.compile(r"[a-z0-9.\-]+|[0-9a-f:.]+")


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

    def check(self, url: str) -> str:
        """The normalised ``url``; raises UrlNotAllowed unless it is http(s) and fully matches
        an allowed regex."""
        if not self.patterns:
            raise UrlNotAllowed(
                f"Registering from a URL is disabled: {url!r} (set allowed_urls to the regexes "
                "of trusted URLs, or put the archive in the model store)"
            )
        normal = normalize_url(url)
        if not any(p.fullmatch(normal) for p in self.patterns):
            raise UrlNotAllowed(f"Given URL {url!r} does not match any allowed URL(s)")
        return normal

    async def __call__(self, url: str) -> Path:
        url = self.check(url)
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
                            # checked (and normalised) before the next hop is ever requested
                            url = self.check(urljoin(url, location))
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


def normalize_url(url: str) -> str:
    """RFC 3986 normalisation for matching ``allowed_urls``; raises UrlNotAllowed on URLs that
    could mean something else to the origin (userinfo, backslashes, control characters, an
    encoded ``/``, ``\\`` or control character, a non-http(s) scheme)."""
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url) or "\\" in url:
        raise UrlNotAllowed(f"URL {url!r} has a space, control character or backslash")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UrlNotAllowed(f"URL {url!r} is malformed ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise UrlNotAllowed(f"Only http(s) URLs can be downloaded, got {url!r}")
    if "@" in parts.netloc:
        raise UrlNotAllowed(f"URL {url!r} has user information; it is not allowed")
    host = _decode(parts.hostname or "", url).lower()
    if not _HOST.fullmatch(host):
        raise UrlNotAllowed(f"URL {url!r} has no valid host")
    if ":" in host:  # IPv6 literal: hostname strips the brackets
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    path = _remove_dot_segments(_decode(parts.path, url)) or "/"
    query = _decode(parts.query, url, path=False)
    return urlunsplit((scheme, netloc, path, query, ""))


def _decode(text: str, url: str, *, path: bool = True) -> str:
    """Decode escapes of unreserved characters (``%2e`` -> ``.``), upper-case the others;
    in a path (or host), refuse encoded ``/``, ``\\`` and control characters."""

    def one(match: re.Match[str]) -> str:
        char = chr(int(match.group(1), 16))
        if char in _UNRESERVED:
            return char
        if path and (char in "/\\" or ord(char) < 0x20 or ord(char) == 0x7F):
            raise UrlNotAllowed(f"URL {url!r} has an encoded {char!r}; it is not allowed")
        return match.group(0).upper()

    if "%" in _ESCAPE.sub("", text):
        raise UrlNotAllowed(f"URL {url!r} has a malformed percent-escape")
    return _ESCAPE.sub(one, text)


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 section 5.2.4 on an absolute path."""
    out: list[str] = []
    segments = path.split("/")
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment == ".":
            if last:
                out.append("")
        elif segment == "..":
            if len(out) > 1:
                out.pop()
            if last:
                out.append("")
        else:
            out.append(segment)
    result = "/".join(out)
    return result if result.startswith("/") else "/" + result


def _file_name(url: str) -> str:
    """A harmless file name from the URL's last path segment (keeps the archive suffix)."""
    name = PurePosixPath(urlsplit(url).path).name or "model.mar"
    name = _SAFE_NAME.sub("_", name).lstrip(".") or "model.mar"
    return name[-100:]
