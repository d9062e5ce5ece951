"""Streaming inside the handler process (``Service.predict`` with a recording PartSink):
TorchServe's send_intermediate_predict_response through the ``ts`` alias, generator results,
cancellation, and errors after parts (never a re-run that would send parts twice)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from torchbay.handlers.context import Context
from torchbay.handlers.runtime.responses import Response
from torchbay.handlers.runtime.service import Service, load_service
from torchbay.handlers.streaming import send_intermediate_predict_response

from .conftest import body_json, req, write_manifest

HANDLER = """
from ts.protocol.otf_message_handler import send_intermediate_predict_response, StreamCancelled

CALLS = []
SEEN = []


def _gen(items, fail_after=None):
    try:
        for i, item in enumerate(items):
            if i == fail_after:
                raise RuntimeError("generator failed")
            yield item
    except GeneratorExit:
        SEEN.append("closed")
        raise


def handle(data, context):
    if data is None:
        return None
    CALLS.append(len(data))
    bodies = [row["body"] for row in data]
    mode = bodies[0]["mode"]
    if mode == "parts":
        for i in range(2):
            for idx in range(len(data)):
                context.set_response_content_type(idx, "text/plain")
            try:
                send_intermediate_predict_response(
                    [f"{b['name']}{i}" for b in bodies], context.request_ids, "Intermediate",
                    200, context,
                )
            except StreamCancelled:
                SEEN.append("cancelled")
                raise
        if any(b.get("raise") for b in bodies):
            raise ValueError("failed after parts")
        return [{"final": b["name"]} for b in bodies]
    if mode == "gen":
        return [_gen(b["items"], b.get("fail_after")) for b in bodies]
    if mode == "ask":
        return [{"cancelled": context.is_cancelled(idx)} for idx in range(len(data))]
    return [b for b in bodies]
"""


class Sink:
    def __init__(self, cancelled: set[str] | None = None) -> None:
        self.parts: list[tuple[str, Response]] = []
        self.gone = cancelled or set()
        self.cancel_after: dict[str, int] = {}  # request id -> cancelled once it has n parts

    def send(self, request_id: str, response: Response) -> None:
        self.parts.append((request_id, response))
        limit = self.cancel_after.get(request_id)
        if limit is not None and sum(rid == request_id for rid, _ in self.parts) >= limit:
            self.gone.add(request_id)

    def cancelled(self, request_id: str) -> bool:
        return request_id in self.gone

    def bodies(self, request_id: str | None = None) -> list[bytes]:
        return [r.body for rid, r in self.parts if request_id in (None, rid)]


@pytest.fixture
def service(tmp_path: Path) -> Service:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "streamer.py").write_text(HANDLER)
    write_manifest(model_dir, serialized=None, handler="streamer.py")
    return load_service(model_dir)


def _module(service: Service) -> dict[str, Any]:
    return service._entry.__globals__


def _req(rid: str, **body: Any):
    return req(json.dumps(body), "application/json", rid=rid)


def test_each_call_sends_one_part_per_request(service: Service) -> None:
    sink = service.part_sink = Sink()
    outcome = service.predict([_req("r0", mode="parts", name="a"), _req("r1", name="b")])
    assert [(rid, r.body) for rid, r in sink.parts] == [
        ("r0", b"a0"), ("r1", b"b0"), ("r0", b"a1"), ("r1", b"b1"),
    ]  # fmt: skip
    assert all(r.content_type == "text/plain" and r.status == 200 for _, r in sink.parts)
    assert [body_json(r) for r in outcome.responses] == [{"final": "a"}, {"final": "b"}]


def test_cancelled_requests_are_skipped_then_the_handler_is_stopped(service: Service) -> None:
    sink = service.part_sink = Sink({"r1"})
    outcome = service.predict([_req("r0", mode="parts", name="a"), _req("r1", name="b")])
    assert sink.bodies("r1") == []  # never sent to a client that left
    assert sink.bodies("r0") == [b"a0", b"a1"]
    assert body_json(outcome.responses[0]) == {"final": "a"}

    sink = service.part_sink = Sink()
    sink.cancel_after = {"r0": 1}
    outcome = service.predict([_req("r0", mode="parts", name="a")])
    assert sink.bodies() == [b"a0"]
    assert _module(service)["SEEN"] == ["cancelled"]  # the handler saw the stop
    assert outcome.responses[0].status == 499


def test_an_error_after_parts_is_not_retried_in_halves(service: Service) -> None:
    sink = service.part_sink = Sink()
    calls = _module(service)["CALLS"]
    outcome = service.predict(
        [_req("r0", mode="parts", name="a", **{"raise": True}), _req("r1", name="b")]
    )
    assert calls == [2]  # one run: bisecting would have sent every part again
    assert sink.bodies() == [b"a0", b"b0", b"a1", b"b1"]
    assert [r.status for r in outcome.responses] == [500, 500]
    assert body_json(outcome.responses[0])["type"] == "ValueError"


def test_generators_stream_in_turn_and_fail_alone(service: Service) -> None:
    sink = service.part_sink = Sink()
    outcome = service.predict(
        [
            _req("r0", mode="gen", items=["a", "b", "c"]),
            _req("r1", items=[{"x": 1}, "y"], fail_after=1),
        ]
    )
    assert [(rid, r.body) for rid, r in sink.parts] == [
        ("r0", b"a"), ("r1", b'{"x":1}'), ("r0", b"b"), ("r0", b"c"),
    ]  # fmt: skip
    first, second = outcome.responses
    assert (first.status, first.body) == (200, b"")  # the stream ended with the generator
    assert second.status == 500 and body_json(second)["type"] == "RuntimeError"


def test_a_cancelled_generator_is_closed(service: Service) -> None:
    sink = service.part_sink = Sink()
    sink.cancel_after = {"r0": 1}
    outcome = service.predict([_req("r0", mode="gen", items=["a", "b", "c"])])
    assert sink.bodies() == [b"a"]
    assert _module(service)["SEEN"] == ["closed"]
    assert outcome.responses[0].status == 499


def test_without_a_frontend_parts_are_dropped(service: Service) -> None:
    outcome = service.predict([_req("r0", mode="parts", name="a")])  # the default NullSink
    assert body_json(outcome.responses[0]) == {"final": "a"}


def test_send_needs_the_handler_context() -> None:
    context = Context("m", "/nowhere", {}, 1, None, "")
    with pytest.raises(RuntimeError, match="context"):
        send_intermediate_predict_response(["x"], {0: "r"}, "", 200, context)
    with pytest.raises(RuntimeError):
        send_intermediate_predict_response(["x"], {0: "r"}, "", 200, None)


def test_both_torchserve_import_paths_are_aliased(service: Service) -> None:
    from ts.handler_utils.utils import send_intermediate_predict_response as utils_send
    from ts.protocol.otf_message_handler import send_intermediate_predict_response as otf_send

    assert utils_send is otf_send is send_intermediate_predict_response


def test_a_handler_can_ask_whether_its_client_left(service: Service) -> None:
    service.part_sink = Sink({"r1"})
    outcome = service.predict([_req("r0", mode="ask"), _req("r1")])
    assert [body_json(r) for r in outcome.responses] == [{"cancelled": False}, {"cancelled": True}]
