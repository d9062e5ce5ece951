"""The fuzz suite's parts: a raw HTTP request, sent with http.client (any method, raw path and
headers; nothing normalised), matched against a port's OpenAPI document, and the checks every
response must pass. Strategies that build requests are in fuzz_strategies.py.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

# Never in a response body, unless the client sent it.
LEAKS = ("Traceback", 'File "', "/tmp/", "/work/", "/home/", "site-packages", '.py"')
# Bodies that answer a status but are not errors (readiness and health).
STATUS_BODIES = ({"ready"}, {"name", "ready"}, {"status"})


@dataclass(frozen=True)
class Req:
    port: str  # "inference" | "management" | "metrics"
    method: str
    path: str  # raw, percent-encoded as sent
    query: str = ""  # raw, without "?"
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    # What the request's content demands whatever the route's other statuses: "ok" (a valid
    # request: 200 when it gets past auth and names a loaded model), "4xx" (invalid: a client
    # error), or "" (anything documented).
    expect: str = ""
    note: str = ""

    def target(self) -> str:
        return self.path + (f"?{self.query}" if self.query else "")

    def repro(self) -> str:
        body = (
            self.body
            if len(self.body) <= 160
            else self.body[:160] + b"...(%d bytes)" % len(self.body)
        )
        heads = ", ".join(f"{k}: {v[:40]}" for k, v in self.headers)
        return f"{self.port} {self.method} {self.target()[:200]} [{heads}] body={body!r}"


@dataclass
class Resp:
    status: int
    headers: dict[str, str]
    body: bytes
    error: str = ""  # no response at all (reset, timeout)


def send(host: str, port: int, req: Req, timeout: float = 60.0) -> Resp:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.putrequest(req.method, req.target(), skip_host=False, skip_accept_encoding=True)
        names = {k.lower() for k, _ in req.headers}
        for k, v in req.headers:
            conn.putheader(k, v.encode("latin-1", "replace"))
        if "content-length" not in names and (req.body or req.method in ("POST", "PUT")):
            conn.putheader("Content-Length", str(len(req.body)))
        # The server may answer (and close) before reading all the body: read that answer.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.endheaders(req.body or None)
        r = conn.getresponse()
        body = r.read()
        return Resp(r.status, {k.lower(): v for k, v in r.getheaders()}, body)
    except (OSError, http.client.HTTPException) as exc:
        return Resp(0, {}, b"", f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


# -- the document: which statuses a request may get ----------------------------------------------


def _segments(path: str) -> list[str]:
    return path.split("/")[1:]


def _segment_re(segment: str) -> re.Pattern[str]:
    """``{model_name}:predict`` -> a pattern: each ``{...}`` matches within one segment."""
    parts = re.split(r"\{[^}]+\}", segment)
    return re.compile("[^/]*".join(re.escape(p) for p in parts))


def _matches(template: str, segments: list[str], suffix: bool) -> bool:
    want = _segments(template)
    if len(segments) < len(want) or (len(segments) > len(want) and not suffix):
        return False
    return all(_segment_re(w).fullmatch(s) for w, s in zip(want, segments, strict=False))


def operation(doc: dict[str, Any], req: Req) -> tuple[str, dict[str, Any]] | None:
    """The documented (path template, operation) this request reaches, or None (unrouted).
    Paths match as the server sees them: percent-decoded (uvicorn), /v2 without a trailing /."""
    path = unquote(req.path)
    if path.startswith("/v2/") and req.port == "inference":
        path = "/" + path.strip("/")
    segments = _segments(path)
    found = []
    for template, item in doc["paths"].items():
        op = item.get(req.method.lower())
        if op is None and req.method == "HEAD" and req.port == "management":
            op = item.get("get")  # Starlette answers HEAD on every GET route
        if op is None and item.get("x-torchbay-any-method"):
            op = item.get("post") or item.get("get")  # TorchServe's route: any method
        if op is not None and _matches(template, segments, item.get("x-torchbay-path-suffix")):
            literal = sum(len(re.sub(r"\{[^}]+\}", "", s)) for s in _segments(template))
            found.append((literal, len(_segments(template)), template, op))
    if not found:
        return None
    found.sort(key=lambda f: (f[0], f[1]), reverse=True)  # literal segments win
    return found[0][2], found[0][3]


def allowed(doc: dict[str, Any], req: Req) -> tuple[str, set[int]]:
    generic = {int(c) for c in doc["x-torchbay-generic-responses"]}
    matched = operation(doc, req)
    if matched is None:
        return "(unrouted)", generic
    template, op = matched
    return template, generic | {int(c) for c in op["responses"]}


# -- the checks ---------------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"bare {name} in a JSON body")


def problems(doc: dict[str, Any], req: Req, resp: Resp, *, authorized: bool) -> list[str]:
    """Everything wrong with this response; [] when it is fine. ``authorized``: the request
    carries a good key (or auth is off)."""
    if resp.error:
        return [f"no response ({resp.error})"]
    route, statuses = allowed(doc, req)
    out = []
    status = resp.status
    if status not in statuses:
        out.append(f"status {status} not documented for {req.method} {route}")
    if status >= 500 and status not in (501, 503, 504):  # 501: the handler cannot explain
        out.append(f"server error {status}")
    sent = req.target() + repr(req.headers) + req.body.decode("utf-8", "replace")
    sent += unquote(sent)
    text = resp.body.decode("utf-8", "replace")
    for leak in LEAKS:
        if leak in text and leak not in sent:
            out.append(f"body leaks {leak!r}")
    if req.method == "HEAD":
        return out  # no body
    data = _json_body(resp, out)
    if status >= 400 and data is not _NOT_JSON:
        out.extend(_error_shape(req, route, status, data))
    elif status >= 400 and status not in (400, 408, 413, 431):
        out.append(f"{status} error body is not JSON")
    error_503 = status == 503 and isinstance(data, dict) and set(data) not in STATUS_BODIES
    if error_503 and "retry-after" not in resp.headers:
        out.append("503 without Retry-After")
    if error_503 and ("WorkerDied" in text or " died" in text):
        out.append("the worker serving this request died")
    out.extend(_expectation(req, status, authorized))
    return out


_NOT_JSON = object()


def _json_body(resp: Resp, out: list[str]) -> Any:
    if not resp.headers.get("content-type", "").startswith("application/json"):
        return _NOT_JSON
    try:
        return json.loads(resp.body, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        out.append(f"JSON body does not parse: {exc}")
        return _NOT_JSON


def _error_shape(req: Req, route: str, status: int, data: Any) -> list[str]:
    if isinstance(data, dict) and set(data) in STATUS_BODIES:
        return []  # {"ready": false} (503), {"status": "Unhealthy"} (500)
    if not isinstance(data, dict):
        return [f"{status} error body is not an object"]
    if req.port == "inference" and req.path.startswith("/v2"):
        return [] if isinstance(data.get("error"), str) else [f"{status} v2 error lacks 'error'"]
    if not {"code", "type", "message"} <= set(data) or data["code"] != status:
        return [f"{status} error body is not {{code,type,message}}: {str(data)[:80]}"]
    return []


def _expectation(req: Req, status: int, authorized: bool) -> list[str]:
    if req.expect == "4xx" and not 400 <= status < 500:
        return [f"invalid input ({req.note}) answered {status}, not a 4xx"]
    if req.expect == "ok" and authorized and status != 200:
        return [f"valid request ({req.note}) answered {status}"]
    return []


def finite(value: str) -> float | None:
    """``value`` as a finite float, else None."""
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def signature(req: Req, doc: dict[str, Any], problem: str) -> str:
    """One line per distinct finding: the route and the problem, numbers elided."""
    route, _ = allowed(doc, req)
    return f"{req.port} {req.method} {route}: {re.sub(r'[0-9]+', 'N', problem)[:120]}"


@dataclass
class Findings:
    """Problems seen, one example each; ``report()`` lists them with a repro."""

    seen: dict[str, tuple[str, Req, Resp]] = field(default_factory=dict)
    count: int = 0

    def add(self, doc: dict[str, Any], req: Req, resp: Resp, found: list[str]) -> None:
        self.count += 1
        for problem in found:
            self.seen.setdefault(signature(req, doc, problem), (problem, req, resp))

    def report(self) -> str:
        lines = [f"{len(self.seen)} distinct finding(s):"]
        for key, (problem, req, resp) in sorted(self.seen.items()):
            lines.append(f"- {key}\n    {problem}\n    repro: {req.repro()}")
            lines.append(f"    got: {resp.status} {resp.body[:300]!r}")
        return "\n".join(lines)
