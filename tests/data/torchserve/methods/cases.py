"""The requests of the ``methods`` record, shared by record.py (TorchServe 0.12) and
tests/server/test_method_answers.py (torchbay): which methods each inference route takes, what
``OPTIONS`` answers, trailing slashes, model names with dots and dashes, percent-encoded names and
version segments. Standard library only (the recorder runs in TorchServe's virtualenv).

Each case is (id, listener, method, raw path, body); ``ask`` sends it with http.client, which
keeps the path as written (no normalisation) and any method, and keeps what a record compares:
status, content type, the ``Allow`` header and the body (JSON, or text; an API description as
its ``openapi`` version and sorted paths).
"""

from __future__ import annotations

import http.client
import json
from typing import Any

ARCHIVES = {  # file: model, version, handler (here)
    "echo.mar": ("echo", "1.0", "echo_handler.py"),
    "a.b-c.mar": ("a.b-c", "1.0", "echo_handler.py"),
}
BODY = b'{"x": 1}'
INF, MAN, MET = "inference", "management", "metrics"

CASES: list[tuple[str, str, str, str, bytes | None]] = [
    ("options_root", INF, "OPTIONS", "/", None),
    ("options_ping", INF, "OPTIONS", "/ping", None),
    ("options_predictions", INF, "OPTIONS", "/predictions/echo", None),
    ("options_predictions_version", INF, "OPTIONS", "/predictions/echo/1.0", None),
    ("options_predictions_unknown", INF, "OPTIONS", "/predictions/nope", None),
    ("options_predictions_unknown_version", INF, "OPTIONS", "/predictions/echo/2.0", None),
    ("options_predictions_dotted", INF, "OPTIONS", "/predictions/a.b-c", None),
    ("options_explanations", INF, "OPTIONS", "/explanations/echo", None),
    ("options_v1_predict", INF, "OPTIONS", "/v1/models/echo:predict", None),
    ("options_v2_infer", INF, "OPTIONS", "/v2/models/echo/infer", None),
    ("options_v2_ready", INF, "OPTIONS", "/v2/health/ready", None),
    ("options_unknown_path", INF, "OPTIONS", "/nope", None),
    ("get_api_description", INF, "GET", "/api-description", None),
    ("options_management_root", MAN, "OPTIONS", "/", None),
    ("options_management_models", MAN, "OPTIONS", "/models", None),
    ("post_predictions", INF, "POST", "/predictions/echo", BODY),
    ("put_predictions", INF, "PUT", "/predictions/echo", BODY),
    ("get_predictions", INF, "GET", "/predictions/echo", None),
    ("delete_predictions", INF, "DELETE", "/predictions/echo", None),
    ("delete_predictions_body", INF, "DELETE", "/predictions/echo", BODY),
    ("patch_predictions", INF, "PATCH", "/predictions/echo", BODY),
    ("head_predictions", INF, "HEAD", "/predictions/echo", None),
    ("delete_predictions_version", INF, "DELETE", "/predictions/echo/1.0", None),
    ("delete_predictions_unknown", INF, "DELETE", "/predictions/nope", None),
    ("post_explanations", INF, "POST", "/explanations/echo", BODY),
    ("delete_explanations", INF, "DELETE", "/explanations/echo", None),
    ("delete_ping", INF, "DELETE", "/ping", None),
    ("post_ping", INF, "POST", "/ping", BODY),
    ("put_ping", INF, "PUT", "/ping", BODY),
    ("head_ping", INF, "HEAD", "/ping", None),
    ("ping_slash", INF, "GET", "/ping/", None),
    ("ping_slashes", INF, "GET", "/ping//", None),
    ("ping_more", INF, "GET", "/ping/more", None),
    ("predictions_slash", INF, "POST", "/predictions/echo/", BODY),
    ("predictions_version_slash", INF, "POST", "/predictions/echo/1.0/", BODY),
    ("predictions_extra_segments", INF, "POST", "/predictions/echo/1.0/more/path", BODY),
    ("predictions_empty_version", INF, "POST", "/predictions/echo//1.0", BODY),
    ("predictions_no_model", INF, "POST", "/predictions/", BODY),
    ("predictions_bare", INF, "POST", "/predictions", BODY),
    ("predictions_version_1", INF, "POST", "/predictions/echo/1", BODY),
    ("predictions_version_unknown", INF, "POST", "/predictions/echo/2.0", BODY),
    ("predictions_dotted", INF, "POST", "/predictions/a.b-c", BODY),
    ("predictions_dotted_version", INF, "POST", "/predictions/a.b-c/1.0", BODY),
    ("predictions_encoded_dot", INF, "POST", "/predictions/a%2Eb-c", BODY),
    ("predictions_encoded_letter", INF, "POST", "/predictions/%65cho", BODY),
    ("predictions_encoded_twice", INF, "POST", "/predictions/ech%256F", BODY),
    ("predictions_version_encoded_twice", INF, "POST", "/predictions/echo/1%252E0", BODY),
    ("describe_encoded_twice", MAN, "GET", "/models/ech%256F", None),
    ("predictions_encoded_slash", INF, "POST", "/predictions/echo%2F1.0", BODY),
    ("predictions_query", INF, "POST", "/predictions/echo?x=1", BODY),
    ("v1_predict", INF, "POST", "/v1/models/echo:predict", b'{"instances": [1]}'),
    ("get_v1_predict", INF, "GET", "/v1/models/echo:predict", None),
    ("delete_v1_predict", INF, "DELETE", "/v1/models/echo:predict", None),
    ("v1_model", INF, "GET", "/v1/models/echo", None),
    ("v2_infer", INF, "POST", "/v2/models/echo/infer", BODY),
    ("delete_v2_infer", INF, "DELETE", "/v2/models/echo/infer", None),
    ("get_v2_infer", INF, "GET", "/v2/models/echo/infer", None),
    ("v2_version_infer", INF, "POST", "/v2/models/echo/versions/1.0/infer", BODY),
    ("v2_ready", INF, "GET", "/v2/health/ready", None),
    ("v2_live", INF, "GET", "/v2/health/live", None),
    ("head_v2_live", INF, "HEAD", "/v2/health/live", None),
    ("head_v2_ready", INF, "HEAD", "/v2/health/ready", None),
    ("delete_v2_ready", INF, "DELETE", "/v2/health/ready", None),
    ("v2_model", INF, "GET", "/v2/models/echo", None),
    ("v2_model_ready", INF, "GET", "/v2/models/echo/ready", None),
    ("v2_server", INF, "GET", "/v2", None),
    ("metrics", MET, "GET", "/metrics", None),
    ("metrics_slash", MET, "GET", "/metrics/", None),
    ("head_metrics", MET, "HEAD", "/metrics", None),
    ("post_metrics", MET, "POST", "/metrics", BODY),
    ("options_metrics_root", MET, "OPTIONS", "/", None),
    ("delete_models_root", MAN, "DELETE", "/models", None),
    ("head_models", MAN, "HEAD", "/models", None),
    ("models_slash", MAN, "GET", "/models/", None),
    ("describe_slash", MAN, "GET", "/models/echo/", None),
    ("describe_dotted", MAN, "GET", "/models/a.b-c", None),
    ("describe_encoded", MAN, "GET", "/models/%65cho", None),
    # a repeated model_name: the first is the one served (NettyUtils.getParameter)
    (
        "invocations_name_twice_unknown_first",
        INF,
        "POST",
        "/invocations?model_name=nope&model_name=echo",
        BODY,
    ),
    (
        "invocations_name_twice_known_first",
        INF,
        "POST",
        "/invocations?model_name=echo&model_name=nope",
        BODY,
    ),
]


def _body(content_type: str, raw: bytes) -> Any:
    try:
        value = json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")
    if isinstance(value, dict) and "openapi" in value:
        info = value.get("info", {})
        return {
            "openapi": value["openapi"],
            "title": info.get("title"),
            "paths": sorted(value["paths"]),
        }
    return value


def ask(bases: dict[str, str], listener: str, method: str, path: str, body: bytes | None) -> dict:
    """One case's answer: status, content type, Allow (or None) and body."""
    host, port = bases[listener].rsplit("//", 1)[1].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        raw = response.read()
        content_type = response.getheader("content-type", "")
        return {
            "status": response.status,
            "content_type": content_type.split(";")[0].strip(),
            "allow": response.getheader("allow"),
            "body": _body(content_type, raw),
        }
    finally:
        connection.close()


def metric_lines(text: str) -> list[str]:
    """A metrics log's lines as ``Name.Unit:<value>|#dimensions`` (less the time, host and
    request id)."""
    lines = []
    for line in text.splitlines():
        metric, _, rest = line.split(" - ", 1)[-1].partition("|#")
        name, _, _value = metric.rpartition(":")
        lines.append(f"{name}:<value>|#{rest.split('|#')[0]}")
    return lines


def run(bases: dict[str, str]) -> list[dict]:
    return [
        {
            "id": case,
            "request": [listener, method, path],
            **ask(bases, listener, method, path, body),
        }
        for case, listener, method, path, body in CASES
    ]
