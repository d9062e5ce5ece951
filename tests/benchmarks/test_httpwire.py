"""The generator's HTTP/1.1 response parser, fed whole, byte by byte and pipelined."""

from __future__ import annotations

import pytest

from torchbay.benchmarks.httpwire import HttpParseError, ResponseParser, build_request


def feed_bytewise(parser: ResponseParser, data: bytes) -> list[tuple[int, int, bool]]:
    out = []
    for i in range(len(data)):
        out += parser.feed(data[i : i + 1])
    return out


def test_content_length_whole_and_bytewise() -> None:
    wire = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello"
    assert ResponseParser().feed(wire) == [(200, 5, True)]
    parser = ResponseParser()
    assert feed_bytewise(parser, wire) == [(200, 5, True)]
    assert parser.idle


def test_pipelined_responses_and_connection_close() -> None:
    wire = (
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\n\r\n{}"
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    assert ResponseParser().feed(wire) == [(503, 2, True), (200, 0, False)]


def test_chunked_with_extension_and_trailer() -> None:
    wire = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"4;ext=1\r\nabcd\r\n3\r\nefg\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    assert ResponseParser().feed(wire) == [(200, 7, True)]
    assert feed_bytewise(ResponseParser(), wire) == [(200, 7, True)]


def test_no_body_statuses_and_100_continue() -> None:
    wire = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n"
    assert ResponseParser().feed(wire) == [(204, 0, True)]


def test_read_until_close() -> None:
    parser = ResponseParser()
    assert parser.feed(b"HTTP/1.0 200 OK\r\n\r\npartial body") == []
    assert parser.feed_eof() == (200, 12, False)


def test_truncated_body_and_garbage_raise() -> None:
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
    with pytest.raises(HttpParseError):
        parser.feed_eof()
    with pytest.raises(HttpParseError):
        ResponseParser().feed(b"SSH-2.0-OpenSSH\r\n\r\n")
    with pytest.raises(HttpParseError):
        ResponseParser().feed(b"HTTP/1.1 abc OK\r\n\r\n")
    with pytest.raises(HttpParseError):
        ResponseParser().feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")


def test_build_request() -> None:
    raw = build_request("POST", "/predictions/m", "h:1", b"abc", {"Authorization": "Bearer k"})
    head, body = raw.split(b"\r\n\r\n", 1)
    assert body == b"abc"
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /predictions/m HTTP/1.1"
    assert b"Content-Length: 3" in lines
    assert b"Authorization: Bearer k" in lines
    with pytest.raises(HttpParseError.__mro__[1]):
        build_request("GET", "/", "h", headers={"X": "a\r\nInjected: 1"})


def test_close_inside_a_head_raises() -> None:
    parser = ResponseParser()
    assert parser.feed(b"HTTP/1.1 200 OK\r\nContent-Le") == []
    assert not parser.idle
    with pytest.raises(HttpParseError):
        parser.feed_eof()


def test_parser_is_httptools() -> None:
    """The hand-written parser is gone: responses are parsed by httptools (llhttp)."""
    import httptools

    assert isinstance(ResponseParser()._parser, httptools.HttpResponseParser)
