"""The response cache: a repeated request answered by the frontend, without a worker.

Opt-in per model version (``responseCache: {enable, maxEntries, maxBytes}``,
``config.model_settings.ResponseCacheConfig``). The plane's :class:`Exchange` asks
:meth:`ResponseCache.lookup` before it queues a request: a hit is answered at once with the stored
response; a miss is queued as any request, and its answer is stored when it is a 200 that did
not stream, and withdrawn when the protocol could not answer it 200 (:meth:`Lookup.withdraw`,
when the exchange closes: an answer gRPC cannot make a ModelInferResponse of, a handler's
headers HTTP refuses, fail each time, never from the cache). So every protocol (TorchServe and
OIP, REST and gRPC) has it, and none has its own.

The key is a blake2b digest of what reaches the handler and can change its answer: the protocol,
the content type, the query string, the request headers (all but the transport's own, which say
how the body travelled, not what it says, those a proxy or tracer sets per request or per hop,
``_UNKEYED``, and the cache directives, ``cache_control.py``) and
the body's bytes, which hold the input tensors' bytes, datatypes and shapes, the requested
outputs and the parameters. A request that differs
from a stored one in any of these is another key. Its priority and timeout are not in the key:
they say when it runs, not what it answers; nor is an OIP request's ``id``, put back into a hit's
answer (``cache_ids.py``; Triton's key has none of them). The entries live per model version
object: a version unloaded and loaded again is a new object with an empty cache, and a
repository load of a loaded model clears its cache, so no answer is ever served across versions
or reloads; a management change of a live setting that decides what a request may ask (the
batch size: :func:`facts_of`) empties it too. An unloaded or unregistered version's answers are
freed then (Triton's unload, the plane's sweep after TorchServe's unregister).

Never cached: a streaming call (``/generate_stream``, ``ModelStreamInfer``,
``StreamPredictions[2]``) or an answer that streamed, a sequence request (``sequence_id`` in an
OIP body, a ``*sequence*`` header), a request naming a shared-memory region (its inputs or its
answer live in the client's memory), a compressed body (``Content-Encoding``: those checks could
not read it), a non-200 answer, and a request carrying ``Cache-Control: no-store`` (HTTP
header or gRPC metadata): the switch-off. ``no-cache`` (or ``Pragma: no-cache``) and ``max-age``
keep a stored answer (or one older than that) from answering: the model runs, and its answer
replaces it; ``only-if-cached`` is a 504 unless a stored answer answers it, so always for a
request never cached (``cache_control.py``: RFC 9111's request directives).

Memory is bounded per version: at most ``maxEntries`` answers and ``maxBytes`` bytes (bodies,
headers, keys and a fixed overhead per entry), least recently used first out; an answer larger
than ``maxBytes`` is not stored. Torch-free.
"""

from __future__ import annotations

import hashlib
import re
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from torchbay.server.errors import RequestTimeout
from torchbay.server.plane.cache_control import UNCACHED, Directives, only_if_cached
from torchbay.server.plane.cache_ids import unscheduled, with_id, without_id
from torchbay.server.plane.schedule import json_header
from torchbay.server.serving import protocol as p

if TYPE_CHECKING:
    from torchbay.server.config.model_settings import ResponseCacheConfig
    from torchbay.server.serving.model import ModelVersion

# Headers not in the key: how the body travelled (its length, the connection), not what it asks;
# and what a proxy, a mesh or a tracer sets per request or per hop (Istio's and KServe's
# x-request-id, W3C and B3 tracing, the forwarding chain, the host name the client dialled): in
# the key, no repeat behind KServe would ever hit (Triton's key has no header at all).
_UNKEYED = (
    b"content-length:",
    b"connection:",
    b"keep-alive:",
    b"te:",
    b"transfer-encoding:",
    b"expect:",
    b"host:",
    b"user-agent:",
    b"via:",
    b"forwarded:",
    b"x-forwarded-",
    b"x-real-ip:",
    b"x-envoy-",
    b"x-request-id:",
    b"x-correlation-id:",
    b"x-amzn-trace-id:",
    b"traceparent:",
    b"tracestate:",
    b"baggage:",
    b"b3:",
    b"x-b3-",
    b"uber-trace-id:",
    b"x-ot-span-context:",
    b"x-cloud-trace-context:",
    b"x-datadog-",
)
_ENCODED = b"content-encoding:"
# A request's priority and timeout (plane/schedule.py): when it runs, not what it answers.
_SCHEDULE_HEADERS = (b"x-torchbay-priority:", b"x-torchbay-timeout-us:")
_HEAD_LENGTH = b"inference-header-content-length:"
# A look-up's key, whether it is an OIP request's (its id out of the key, cache_ids.py), its id,
# the most seconds a stored answer may have to answer it (None: any; cache_control.py), and
# whether it asks to be answered from the cache only (only-if-cached).
Keyed = tuple[bytes, bool, "str | None", "float | None", bool]
# The calls that stream by their nature: a streaming client is never answered from the cache.
_STREAMING = ("/generate_stream", "/ModelStreamInfer", "/StreamPredictions", "/StreamPredictions2")
# In an OIP body: a sequence's request, or a tensor in a shared-memory region.
_UNCACHEABLE_V2 = (b'"sequence_id"', b'"shared_memory_region"')
# JSON's only escape that can spell a name's letters: ``\u00XX`` (ASCII), undone before the search.
_ASCII_ESCAPE = re.compile(rb"\\u00([0-7][0-9a-fA-F])")
ENTRY_OVERHEAD = 256  # bytes an entry costs beyond its body, headers and key (objects, dict slot)
# (model version, hit, seconds spent) for each lookup: the statistics' cache_hit / cache_miss.
Counted = Callable[["ModelVersion", bool, float], None]


def entry_size(key: bytes, response: p.WireResponse) -> int:
    """What one stored answer counts against ``maxBytes``."""
    headers = sum(len(k) + len(v) for k, v in response.headers.items())
    return ENTRY_OVERHEAD + len(key) + len(response.body) + len(response.content_type) + headers


class VersionCache:
    """One model version's entries, least recently used first, bounded by its settings;
    ``facts``: the version's live settings its entries were answered under (:func:`facts_of`)."""

    __slots__ = ("bytes", "entries", "facts", "settings")

    def __init__(self, settings: ResponseCacheConfig, facts: tuple[Any, ...] = ()) -> None:
        self.settings = settings
        self.facts = facts
        # key -> (answer, its size, when it was stored: time.monotonic())
        self.entries: OrderedDict[bytes, tuple[p.WireResponse, int, float]] = OrderedDict()
        self.bytes = 0

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0

    def get(self, key: bytes, max_age: float | None = None) -> p.WireResponse | None:
        """The answer stored under ``key``; None when there is none, or (``max_age``: the
        request's ``Cache-Control``, cache_control.py) it is older than ``max_age`` seconds."""
        found = self.entries.get(key)
        if found is None:
            return None
        if max_age is not None and (max_age <= 0 or time.monotonic() - found[2] > max_age):
            return None  # the request's miss replaces it
        self.entries.move_to_end(key)
        return found[0]

    def put(self, key: bytes, response: p.WireResponse) -> bool:
        """Store ``response`` under ``key`` (False: larger than ``maxBytes``, not stored), then
        drop the least recently used entries until both bounds hold."""
        size = entry_size(key, response)
        if size > self.settings.max_bytes:
            return False
        self.drop(key)
        self.entries[key] = (response, size, time.monotonic())
        self.bytes += size
        self.bound()
        return True

    def drop(self, key: bytes) -> None:
        old = self.entries.pop(key, None)
        if old is not None:
            self.bytes -= old[1]

    def bound(self) -> None:
        limits = self.settings
        while self.entries and (
            len(self.entries) > limits.max_entries or self.bytes > limits.max_bytes
        ):
            _, entry = self.entries.popitem(last=False)
            self.bytes -= entry[1]


class Lookup:
    """One cacheable request's look-up: its key, and the stored answer on a hit."""

    __slots__ = ("_counted", "cache", "facts", "hit", "key", "model", "oip", "spent", "stored")

    def __init__(
        self,
        model: ModelVersion,
        cache: VersionCache,
        keyed: Keyed,
        counted: Counted,
        started: float,
    ) -> None:
        self.model = model
        self.cache = cache
        self.facts = cache.facts  # a live change while it runs: its answer is not stored
        self.key, self.oip, rid, max_age, only = keyed
        found = cache.get(self.key, max_age)
        if found is None and only:  # RFC 9111's only-if-cached: 504, the model does not run
            raise RequestTimeout(UNCACHED)
        # An OIP answer is held without its id (cache_ids.py): the asking request's is put in.
        self.hit = found if found is None or not self.oip else with_id(found, rid)
        self._counted = counted
        self.stored: p.WireResponse | None = None  # what its answer put in the cache
        self.spent = time.perf_counter() - started  # the key's digest and the look-up
        if self.hit is not None:
            counted(model, True, self.spent)

    def store(self, response: p.WireResponse | None) -> None:
        """A miss's first answer (None: it failed or its caller left): stored when it is a
        whole 200 answer (with a body, over OIP); the miss is counted with its look-up and
        insertion time (Triton's ``cache_miss``; the inference between them is not the cache's)."""
        started = time.perf_counter()
        fresh = facts_of(self.model) == self.facts
        if fresh and response is not None and response.status == 200 and not response.partial:
            limit = self.cache.settings.max_bytes
            held = without_id(response, limit) if self.oip else response
            # None: it does not inflate within maxBytes; an OIP answer with no body is the 500
            # "The model gave no response" (Exchange.answers_once).
            if held is not None and (held.body or not self.oip) and self.cache.put(self.key, held):
                self.stored = held
        self._counted(self.model, False, self.spent + time.perf_counter() - started)

    def withdraw(self) -> None:
        """Drop the answer this miss stored (still the one held under its key): the protocol
        could not answer it 200 (gRPC could not convert it, HTTP refused the handler's headers),
        so a repeat is to fail as it did, not be answered from the cache."""
        held = self.cache.entries.get(self.key)
        if self.stored is not None and held is not None and held[0] is self.stored:
            self.cache.drop(self.key)
        self.stored = None


class ResponseCache:
    """The server's response caches, one per model version that enables it."""

    def __init__(self, counted: Counted | None = None) -> None:
        self._versions: weakref.WeakKeyDictionary[ModelVersion, VersionCache] = (
            weakref.WeakKeyDictionary()
        )
        self._counted: Counted = counted or (lambda mv, hit, seconds: None)

    def of(self, mv: ModelVersion) -> VersionCache | None:
        """``mv``'s cache, None when it does not enable one; settings changed since it was made
        (a repository load with a new config) bound it anew."""
        settings = getattr(mv.config, "response_cache", None)
        if settings is None or not settings.enable or mv.closing:
            return None
        cache = self._versions.get(mv)
        facts = facts_of(mv)
        if cache is None:
            self.sweep()
            cache = self._versions[mv] = VersionCache(settings, facts)
        elif cache.settings != settings:
            cache.settings = settings
            cache.bound()
        if cache.facts != facts:  # a live change since: its answers were given under others
            cache.clear()
            cache.facts = facts
        return cache

    def lookup(
        self, mv: ModelVersion, wire: p.WireRequest, path: str, cacheable: bool = True
    ) -> Lookup | None:
        """The look-up of a request to ``mv`` on ``path`` (its URL path or gRPC method), or None
        when it is not to be cached (see the module docstring; ``cacheable`` False: a sequence's).
        RequestTimeout (504) for a request that asks ``only-if-cached`` and is a miss, or one
        that a cache of ``mv`` never holds (a stream, a sequence, ``no-store``, a region)."""
        cache = self.of(mv)
        if cache is None:
            return None
        started = time.perf_counter()
        found = keyed(wire) if cacheable and not path.endswith(_STREAMING) else None
        if found is None and only_if_cached(wire.raw_headers, wire.headers):
            raise RequestTimeout(UNCACHED)
        return None if found is None else Lookup(mv, cache, found, self._counted, started)

    def clear(self, mv: ModelVersion) -> None:
        """Forget ``mv``'s answers (a repository load of the loaded model reloads it)."""
        self._versions.pop(mv, None)

    def sweep(self) -> None:
        """Free the answers of versions unloaded since (a request in flight can hold one): after
        every management change (TorchServe's unregister), when a cache is made, when scraped."""
        for mv in [mv for mv in self._versions if mv.closing]:
            self._versions.pop(mv, None)

    def sizes(self) -> Iterator[tuple[ModelVersion, int, int]]:
        """(model version, entries, bytes) of every version that has a cache (metrics); the
        unloaded versions' answers are freed first."""
        self.sweep()
        for mv, cache in list(self._versions.items()):
            yield mv, len(cache.entries), cache.bytes


def facts_of(mv: ModelVersion) -> tuple[Any, ...]:
    """The live settings (the management API's ``PUT /models/{m}``) that decide whether a
    request is refused or what it answers, so its cached answer too: the batch size, an OIP
    request's ``max_batch_size`` (``Exchange._v2_facts``: a request of a larger batch is
    refused). A change empties the version's cache, as Triton's load of a new configuration
    does; the batching delay, the timeouts, the queue-time bound and the autopilot's target
    say when a request runs, not what it answers, and keep it."""
    return (mv.settings.batch_size,)


def request_key(wire: p.WireRequest) -> bytes | None:
    """:func:`keyed`'s key alone."""
    found = keyed(wire)
    return None if found is None else found[0]


def keyed(wire: p.WireRequest) -> Keyed | None:
    """The digest of what can change ``wire``'s answer, or None when it must not be cached
    (the switch-off, a sequence, a shared-memory region, a compressed body). 32 bytes: a client
    that could make two requests collide could have one answered with the other's answer.
    The request's priority and timeout say when it runs, not what it answers: they are left
    out (Triton's key has neither), so a repeat at another priority or timeout is a hit. So is
    an OIP request's ``id`` (Triton's key has none): a hit's answer gets its own
    (``cache_ids.py``). (key, whether the id is out of it, the request's id, the most seconds
    a stored answer may have to answer it: ``cache_control.py``)."""
    h = hashlib.blake2b(digest_size=32)
    h.update(f"{wire.protocol}\0{wire.content_type}\0{wire.query}\0".encode("utf-8", "replace"))
    body, skipped, oip, rid = wire.body, _SCHEDULE_HEADERS, False, None
    parts: list[bytes | memoryview] = [body]
    if wire.protocol == "v2":
        if _names_uncacheable(body):
            return None
        if wire.raw_headers.count(_HEAD_LENGTH) > 1:
            return None  # two lengths: the key reads the first, the worker the last
        head = json_header(wire)  # the JSON, then (binary extension) the tensors' bytes
        if len(head) < len(body):
            skipped += (_HEAD_LENGTH,)  # the JSON's length: its prefix below
        oip = True  # its answer is held without its id
        plain, rid = unscheduled(head)
        parts = [len(plain).to_bytes(8, "big"), plain, memoryview(body)[len(head) :]]
    said = _hash_headers(h, wire.raw_headers, wire.headers, skipped)
    if said is None:
        return None
    h.update(b"\xff\xff\xff\xff")  # the headers' end: no header line is that long
    for part in parts:
        h.update(part)
    return h.digest(), oip, rid, said.fresh_for(), said.only_if_cached


def _names_uncacheable(body: bytes) -> bool:
    """An OIP body that names a sequence id or a shared-memory region, written plainly or with
    its letters escaped (``"shared_memory_regio\\u006e"`` is the same name to the JSON parser
    that reads the request). A false match (the bytes in a tensor's data) only skips the cache."""
    if any(marker in body for marker in _UNCACHEABLE_V2):
        return True
    if b"\\u00" not in body:
        return False
    plain = _ASCII_ESCAPE.sub(lambda m: bytes([int(m[1], 16)]), body)
    return any(marker in plain for marker in _UNCACHEABLE_V2)


def _hash_headers(
    h: Any, raw: bytes, headers: Mapping[str, str], skipped: tuple[bytes, ...]
) -> Directives | None:
    """Add the headers that reach the handler to ``h`` (HTTP's raw lines, or gRPC's metadata),
    but the ``skipped`` ones and the request's cache directives (``Cache-Control``, ``Pragma``:
    what they say is returned); None when the request is not to be cached (``no-store``, a
    sequence id, a compressed body)."""
    lines = raw.split(b"\r\n") if raw else []
    lines += [f"{k}: {v}".encode("utf-8", "replace") for k, v in sorted(headers.items())]
    said = Directives()
    for line in lines:
        low = line.lower()
        if said.read(low):
            continue  # how it may be answered, not what it asks: not in the key
        if b"sequence" in low.partition(b":")[0]:
            return None
        if low.startswith(_ENCODED) and not low.endswith(b"identity"):
            return None  # a compressed body hides what the checks of ``request_key`` read
        if not low.startswith(_UNKEYED) and not low.startswith(skipped):
            # length-prefixed: no line can pass for the body
            h.update(len(line).to_bytes(4, "big") + line)
    return None if said.no_store else said
