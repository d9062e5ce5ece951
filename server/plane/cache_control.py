"""A request's say over the response cache (``cache.py``): RFC 9111's request directives.

Read from ``Cache-Control`` (HTTP headers or gRPC metadata, every line of it, directive names
in any case) and, when the request has no ``Cache-Control``, HTTP/1.0's ``Pragma: no-cache``
(RFC 9111 section 5.4), as a shared cache reads them:

* ``no-store``: the request and its answer are not cached at all: not looked up, not stored;
* ``no-cache`` (or ``Pragma: no-cache``, or ``max-age=0``): no stored answer is used, the model
  runs, and its answer is stored (replacing the one held: a refresh);
* ``max-age=N``: a stored answer older than ``N`` seconds is not used (the model runs, and its
  answer replaces the old one); a malformed ``N`` is read as 0;
* ``only-if-cached``: answered from the cache or not at all: without a stored answer (fresh
  as the others ask) it is a 504 and the model does not run (RFC 9111 section 5.2.1.7).

The other directives (``max-stale``, ``min-fresh``, ``no-transform``, extensions) are not for
this cache and are ignored, as RFC 9111 says of unknown ones. Neither
header is in the cache's key: it says how the request may be answered, not what it asks.
Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

CACHE_CONTROL = b"cache-control:"
PRAGMA = b"pragma:"
UNCACHED = "The response cache holds no answer to this request (Cache-Control: only-if-cached)"


class Directives:
    """What a request's ``Cache-Control`` and ``Pragma`` lines say to the cache."""

    __slots__ = ("_control", "_pragma", "max_age", "no_store", "only_if_cached")

    def __init__(self) -> None:
        self.no_store = False
        self.only_if_cached = False
        self.max_age: float | None = None  # seconds a stored answer may have; None: any
        self._pragma = False  # Pragma: no-cache seen
        self._control = False  # Cache-Control seen

    def read(self, low: bytes) -> bool:
        """Take one header line (lower-cased ``name: value``); whether it was one of the two."""
        if low.startswith(CACHE_CONTROL):
            self._control = True
            for name, value in _split(low[len(CACHE_CONTROL) :]):
                self._directive(name, value)
            return True
        if low.startswith(PRAGMA):
            self._pragma = self._pragma or any(n == b"no-cache" for n, _ in _split(low[7:]))
            return True
        return False

    def _directive(self, name: bytes, value: bytes | None) -> None:
        if name == b"no-store":
            self.no_store = True
        elif name == b"only-if-cached":
            self.only_if_cached = True
        elif name == b"no-cache":
            self.max_age = 0.0
        elif name == b"max-age":
            age = _seconds(value)
            self.max_age = age if self.max_age is None else min(self.max_age, age)

    def fresh_for(self) -> float | None:
        """The most seconds a stored answer may have to answer the request (0: none may;
        None: any), once every line is read."""
        if self._pragma and not self._control:
            return 0.0
        return self.max_age


def only_if_cached(raw: bytes, headers: Mapping[str, str]) -> bool:
    """Whether a request's HTTP lines (``raw``) or gRPC metadata ask ``only-if-cached``."""
    said = Directives()
    for line in raw.split(b"\r\n") if raw else ():
        said.read(line.lower())
    for name, value in headers.items():
        said.read(f"{name}: {value}".lower().encode("utf-8", "replace"))
    return said.only_if_cached


def _split(value: bytes) -> Iterable[tuple[bytes, bytes | None]]:
    """``a, b=1, c="x"``: the directives, names stripped, a quoted value unquoted."""
    for part in value.split(b","):
        name, eq, arg = part.partition(b"=")
        name = name.strip()
        if name:
            yield name, arg.strip().strip(b'"') if eq else None


def _seconds(value: bytes | None) -> float:
    """A delta-seconds value (digits only, RFC 9111 section 1.2.2; past 2**31, 2**31); one that
    is not one is 0: no stored answer is read as fresher than the client asked."""
    if value is None or not value.isdigit():
        return 0.0
    digits = value.lstrip(b"0") or b"0"
    return float(min(int(digits), 1 << 31)) if len(digits) <= 10 else float(1 << 31)
