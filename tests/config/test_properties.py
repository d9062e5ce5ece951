from __future__ import annotations

import json

import pytest

from torchbay.server.config.properties import PropertiesError, parse_properties

# The shape of anchors 1.7's example: models= JSON continued over lines with backslashes.
TS_CONFIG = r"""
# TorchServe config
! also a comment
inference_address=http://0.0.0.0:8080
management_address : http://0.0.0.0:8081
metrics_address http://0.0.0.0:8082
number_of_netty_threads=32
job_queue_size=1000
model_store=/home/model-server/model-store
models={\
  "noop": {\
    "1.0": {\
        "defaultVersion": true,\
        "marName": "noop.mar",\
        "minWorkers": 1,\
        "maxWorkers": 4,\
        "batchSize": 8,\
        "maxBatchDelay": 100,\
        "responseTimeout": 120\
    }\
  }\
}
"""


def test_separators_comments_and_continuation() -> None:
    props = parse_properties(TS_CONFIG)
    assert props["inference_address"] == "http://0.0.0.0:8080"
    assert props["management_address"] == "http://0.0.0.0:8081"
    assert props["metrics_address"] == "http://0.0.0.0:8082"
    assert props["job_queue_size"] == "1000"
    assert not any(k.startswith(("#", "!")) for k in props)
    models = json.loads(props["models"])
    assert models["noop"]["1.0"]["marName"] == "noop.mar"
    assert models["noop"]["1.0"]["batchSize"] == 8
    assert next(iter(props)) == "inference_address"


def test_escapes() -> None:
    text = "a\\=b\\:c = x\\ty\\nz\\\\ \\u00e9\nkey\\ with\\ space = v\n"
    props = parse_properties(text)
    assert props["a=b:c"] == "x\ty\nz\\ \u00e9"
    assert props["key with space"] == "v"


def test_whitespace_trimmed_and_empty_values() -> None:
    props = parse_properties("  spaced   =   value   \nempty=\nbare\n")
    assert props == {"spaced": "value", "empty": "", "bare": ""}


def test_escaped_trailing_space_kept() -> None:
    assert parse_properties("k=v\\ \n")["k"] == "v "


def test_even_backslashes_do_not_continue() -> None:
    props = parse_properties("path=C:\\\\\nnext=1\n")
    assert props == {"path": "C:\\", "next": "1"}


def test_continuation_line_starting_with_hash_is_not_a_comment() -> None:
    assert parse_properties("k=a\\\n   #b\n")["k"] == "a#b"


def test_later_duplicate_wins() -> None:
    assert parse_properties("k=1\nk=2\n") == {"k": "2"}


def test_bad_unicode_escape() -> None:
    with pytest.raises(PropertiesError, match="line 2"):
        parse_properties("ok=1\nbad=\\u12\n")


@pytest.mark.parametrize("separator", ["\x0b", "\x0c", "\x1c", "\x85", "\u2028"])
def test_only_cr_and_lf_end_a_line_as_in_java(separator: str) -> None:
    """java.util.Properties breaks lines at \\n and \\r only (a form feed is whitespace). Was:
    str.splitlines, which also breaks at these, so one line read as two keys."""
    text = f"a=1{separator}b=2\nc=3\r\nd=4\re=5"
    assert parse_properties(text) == {"a": f"1{separator}b=2", "c": "3", "d": "4", "e": "5"}
