"""handlers.testing: the handler author's helper runs the worker's own predict path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchbay.archiver.package import ArchiveOptions, package
from torchbay.handlers.errors import BadInput
from torchbay.handlers.testing import load_handler, make_context, make_request, run_handler


def doubler(data, context):
    """A function handler: TorchServe calls it once with data=None to initialize."""
    if data is None:
        return None
    out = []
    for row in data:
        value = row.get("body")
        if value == "boom":
            raise RuntimeError("secret /etc/passwd detail")
        if value == "bad":
            raise BadInput("value must be a number")
        out.append({"double": value * 2})
    return out


class Greeter:
    """A class handler that sets statuses, headers and a custom metric."""

    def initialize(self, context):
        self.greeting = context.model_yaml_config.get("greeting", "hello")
        self.batch_size = context.system_properties["batch_size"]

    def handle(self, data, context):
        context.metrics.add_counter("Greetings", len(data))
        out = []
        for i, row in enumerate(data):
            context.set_response_header(i, "X-Batch", str(len(data)))
            name = row["body"]
            if name == "teapot":
                context.set_response_status(418, "I'm a teapot", idx=i)
            out.append(f"{self.greeting} {name}")
        return out


def test_run_handler_decodes_isolates_and_hides_internals() -> None:
    broken = (b"--x\r\nbroken", "multipart/form-data; boundary=x")
    replies = run_handler(doubler, [{"x": 1}, 21, broken, "boom", "bad", 5])
    assert [r.status for r in replies] == [500, 200, 400, 500, 400, 200]
    # A dict has no "* 2"-able body: the TypeError is the handler's bug, answered alone.
    assert replies[1].json() == {"double": 42} and replies[5].json() == {"double": 10}
    assert replies[2].json()["type"] == "BadInput"
    boom = replies[3].json()
    assert boom["type"] == "RuntimeError" and "/etc/passwd" not in replies[3].text
    assert "Traceback" not in replies[3].text
    assert replies[4].json() == {
        "code": 400,
        "type": "BadInput",
        "message": "value must be a number",
    }
    assert all(r.content_type == "application/json" for r in replies)
    status, headers, body = replies[1]
    assert (status, headers, body) == (200, {"content-type": "application/json"}, b'{"double":42}')


def test_runner_batches_statuses_headers_and_metrics() -> None:
    with load_handler(Greeter, batch_size=2, model_yaml_config={"greeting": "hi"}) as runner:
        assert runner.context.system_properties["batch_size"] == 2
        replies = runner.run(["ada", "teapot", "bob"])
        assert [r.text for r in replies] == ["hi ada", "hi teapot", "hi bob"]
        assert [r.status for r in replies] == [200, 418, 200]
        # Batches of at most 2, as a worker with batch_size 2 receives them.
        assert [r.headers["x-batch"] for r in replies] == ["2", "2", "1"]
        assert replies[0].content_type == "text/plain; charset=utf-8"
        counts = [m["value"] for m in runner.metrics if m["name"] == "Greetings"]
        assert counts == [2.0, 1.0]


def test_make_context_and_make_request() -> None:
    ctx = make_context(
        "/tmp", model_name="m", batch_size=4, gpu_id=None, model_yaml_config={"a": 1}
    )
    assert ctx.model_name == "m" and ctx.model_yaml_config == {"a": 1}
    assert ctx.system_properties["batch_size"] == 4 and ctx.system_properties["gpu_id"] is None
    assert ctx.metrics is not None and ctx.metrics.drain() == []
    req = make_request({"a": [1, 2]}, headers={"X-Id": "7"})
    assert req.content_type == "application/json" and json.loads(req.body) == {"a": [1, 2]}
    assert req.headers == {"x-id": "7", "content-type": "application/json"}
    assert make_request("hé").body == "hé".encode()
    assert make_request(b"\x00", content_type="image/png").content_type == "image/png"


def test_v2_protocol_goes_through_the_oip_envelope() -> None:
    oip = {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1.5, 2.0]}]}
    replies = run_handler(doubler, [oip, {"inputs": "nope"}], protocol="v2")
    assert replies[1].status == 400
    body = replies[0].json()
    assert replies[0].status == 200 and body["model_name"] == "model"
    # The handler saw the input's data; its dict result went back as one BYTES output.
    assert [json.loads(d) for d in body["outputs"][0]["data"]] == [{"double": [1.5, 2.0, 1.5, 2.0]}]


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("helper")
    torch.manual_seed(0)
    model = torch.jit.script(torch.nn.Linear(4, 3).eval())
    torch.jit.save(model, str(root / "lin.pt"))
    handler = root / "sum_handler.py"
    handler.write_text(
        "def handle(data, context):\n"
        "    if data is None:\n        return None\n"
        "    return [{'sum': sum(row['body'])} for row in data]\n"
    )
    for name, spec in (("lin", "tensor"), ("summer", str(handler))):
        package(
            ArchiveOptions(
                model_name=name,
                version="1.0",
                serialized_file=root / "lin.pt",
                handler=spec,
                export_path=root,
            )
        )
    return root


def test_run_handler_on_archives_and_handler_files(archives: Path) -> None:
    replies = run_handler(archives / "lin.mar", [[[1.0, 2.0, 3.0, 4.0]], [[1.0]]])
    assert replies[0].status == 200
    assert len(replies[0].json()["output"][0]) == 3
    assert replies[1].status == 422  # a well-formed input of the wrong shape
    assert run_handler(archives / "summer.mar", [[1, 2, 3]])[0].json() == {"sum": 6}
    # A handler file on disk: its folder is the model directory.
    assert run_handler(archives / "sum_handler.py", [[4, 5]])[0].json() == {"sum": 9}


def test_import_is_torch_free() -> None:
    code = "import sys, torchbay.handlers.testing; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def streamer(data, context):
    """Streams each word of its text as a part (TorchServe's API); the last word is the result."""
    if data is None:
        return None
    from ts.protocol.otf_message_handler import send_intermediate_predict_response

    words = [row["body"].split() for row in data]
    for step in range(max(len(w) for w in words) - 1):
        live = {i: context.request_ids[i] for i, w in enumerate(words) if step < len(w) - 1}
        parts = [w[step] + " " if step < len(w) - 1 else None for w in words]
        send_intermediate_predict_response(parts, live, "Intermediate", 200, context)
    return [w[-1] for w in words]


def counter(data, context):
    """A generator per request: each yielded item is a part."""
    if data is None:
        return None
    return [(str(i) for i in range(int(row["body"]))) for row in data]


def test_streamed_parts_are_collected_per_request() -> None:
    replies = run_handler(streamer, ["one two three", "solo", "a b"])
    assert [r.status for r in replies] == [200, 200, 200]
    assert replies[0].parts == (b"one ", b"two ") and replies[0].body == b"three"
    assert replies[0].streamed == b"one two three"
    assert replies[1].parts == () and replies[1].streamed == b"solo"
    assert replies[2].parts == (b"a ",) and replies[2].streamed == b"a b"
    generated = run_handler(counter, ["3", "0"], batch_size=1)
    assert generated[0].parts == (b"0", b"1", b"2") and generated[0].body == b""
    assert generated[1].parts == () and generated[1].status == 200


def test_handler_object_with_a_model_dir_loads_its_model(archives: Path, tmp_path: Path) -> None:
    from torchbay.archiver.extract import extract_archive
    from torchbay.handlers.base_handler import BaseHandler

    class Rows(BaseHandler):
        def preprocess(self, data):
            return torch.tensor([row["body"] for row in data], dtype=torch.float32)

        def postprocess(self, data):
            return [{"n": len(row)} for row in data.tolist()]

    folder = tmp_path / "lin"
    extract_archive(archives / "lin.mar", folder)
    replies = run_handler(Rows, [[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 1.0]], model_dir=folder)
    # BaseHandler.initialize loaded the folder's Linear(4, 3) from its manifest.
    assert [r.json() for r in replies] == [{"n": 3}, {"n": 3}]


def test_import_by_path_imports_a_file_once_under_its_own_name(tmp_path):
    from torchbay.handlers.testing import import_by_path

    (tmp_path / "model.py").write_text("STAMP = 1\n")
    (tmp_path / "counter.py").write_text("RUNS = []\nRUNS.append(1)\n")
    name = f"_tb_test_import_by_path_{tmp_path.name}"
    first = import_by_path(tmp_path / "counter.py", name)
    second = import_by_path(tmp_path / "counter.py", name)
    assert first is second and first.RUNS == [1]  # executed once
    other = import_by_path(tmp_path / "model.py", name + "_model")
    assert other is not first and other.STAMP == 1


def test_import_by_path_leaves_nothing_behind_when_the_file_fails(tmp_path):
    import sys

    from torchbay.handlers.testing import import_by_path

    (tmp_path / "broken.py").write_text("raise RuntimeError('no')\n")
    name = f"_tb_test_broken_{tmp_path.name}"
    with pytest.raises(RuntimeError, match="no"):
        import_by_path(tmp_path / "broken.py", name)
    assert name not in sys.modules
    (tmp_path / "broken.py").write_text("OK = True\n")
    assert import_by_path(tmp_path / "broken.py", name).OK
