"""The requests of record.py, shared with the torchbay test that replays them: (id, path,
query, headers, body). ``path`` is ``predictions`` (``/predictions/inputs``) or ``invocations``
(SageMaker's ``/invocations``, the one model loaded)."""

from __future__ import annotations

import http.client
import json

B = "XyZboundary"


def _part(disposition: str, content_type: str | None, data: bytes) -> bytes:
    head = f"--{B}\r\nContent-Disposition: form-data; {disposition}\r\n"
    if content_type is not None:
        head += f"Content-Type: {content_type}\r\n"
    return head.encode() + b"\r\n" + data + b"\r\n"


MULTIPART = (
    b"".join(
        [
            _part('name="field"', None, "caf\u00e9 1".encode()),
            _part('name="typed"', "text/plain", b"typed text"),
            _part('name="file"; filename="a.bin"', "application/octet-stream", b"\x00\x01raw"),
            _part('name="textfile"; filename="a.txt"', "text/plain", b"file text"),
            _part('name="jsonfile"; filename="a.json"', "application/json", b'{"k": [1, 2]}'),
            _part('name="plainfile"; filename="b.bin"', None, b"no type"),
        ]
    )
    + f"--{B}--\r\n".encode()
)
FORM = f"multipart/form-data; boundary={B}"
URLENCODED = "application/x-www-form-urlencoded"
P = "predictions"
CASES: list[tuple[str, str, str, dict[str, str], bytes]] = [
    ("octet_stream", P, "", {"Content-Type": "application/octet-stream"}, b"\x00\x01abc"),
    ("no_content_type", P, "", {}, b"abc"),
    ("text_plain", P, "", {"Content-Type": "text/plain"}, "h\u00e9llo".encode()),
    ("text_latin1", P, "", {"Content-Type": "text/plain; charset=latin-1"}, b"h\xe9llo"),
    ("text_csv", P, "", {"Content-Type": "text/csv"}, b"a,b\n1,2"),
    ("json", P, "", {"Content-Type": "application/json"}, b'{"x": [1, 2]}'),
    ("json_charset", P, "", {"Content-Type": "application/json; charset=utf-8"}, b"[1]"),
    ("json_invalid", P, "", {"Content-Type": "application/json"}, b"{not json"),
    ("json_deep", P, "", {"Content-Type": "application/json"}, b"[" * 2000 + b"]" * 2000),
    ("ld_json", P, "", {"Content-Type": "application/ld+json"}, b'{"x": 1}'),
    ("json_empty", P, "", {"Content-Type": "application/json"}, b""),
    ("multipart", P, "", {"Content-Type": FORM}, MULTIPART),
    ("urlencoded", P, "", {"Content-Type": URLENCODED}, b"a=1&b=x+y&c=%C3%A9"),
    ("query", P, "q=1&q=2&r=%C3%A9&blank=", {"Content-Type": "text/plain"}, b"t"),
    ("query_over_body", P, "a=query", {"Content-Type": URLENCODED}, b"a=body"),
    ("query_named_body", P, "body=query", {"Content-Type": "text/plain"}, b"text"),
    ("query_no_body", P, "q=1", {}, b""),
    ("headers", P, "", {"X-Probe": "v1", "Content-Type": "text/plain"}, b"t"),
    ("inv_multipart", "invocations", "", {"Content-Type": FORM}, MULTIPART),
    ("inv_urlencoded", "invocations", "", {"Content-Type": URLENCODED}, b"a=1"),
    ("inv_query", "invocations", "q=1", {"Content-Type": "text/plain"}, b"t"),
    ("inv_json_invalid", "invocations", "", {"Content-Type": "application/json"}, b"{bad"),
    ("text_not_utf8", P, "", {"Content-Type": "text/plain"}, b"\xff\xfe"),
    ("urlencoded_repeated", P, "", {"Content-Type": URLENCODED}, b"a=1&a=2"),
    ("urlencoded_empty", P, "", {"Content-Type": URLENCODED}, b""),
    ("inv_query_repeated", "invocations", "q=1&q=2", {"Content-Type": "text/plain"}, b"t"),
]


def ask(port: int, path: str, query: str, headers: dict[str, str], body: bytes) -> dict:
    """One case's request (http.client: the headers exactly as given, none added)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    url = "/predictions/inputs" if path == "predictions" else "/invocations"
    try:
        connection.request("POST", url + (f"?{query}" if query else ""), body, headers)
        response = connection.getresponse()
        raw = response.read()
        try:
            return {"status": response.status, "body": json.loads(raw)}
        except ValueError:
            return {"status": response.status, "body": raw.decode("latin-1")}
    finally:
        connection.close()
