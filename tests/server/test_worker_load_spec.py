"""The worker's ``Load`` is the launch spec serialized: every field reaches ``load_service`` by
name, except the ones the worker applies itself (threads, pinning, the response bound)."""

from __future__ import annotations

import dataclasses

from torchbay.handlers.runtime.service import load_service
from torchbay.server.serving import protocol as p
from torchbay.server.worker.main import _service_options

# model_dir: load_service's positional; max_response_size: the worker bounds each response
WORKER_OWN = {"model_dir", "num_threads", "cpu_affinity", "max_response_size"}


def test_every_load_field_reaches_the_service_or_the_worker() -> None:
    load = p.Load(
        "/models/m",
        "m",
        "2",
        8,
        gpu_id=1,
        handler="custom.py",
        server_version="9.9",
        limit_max_image_pixels=False,
        max_request_size=1234,
        decode_input_request=False,
    )
    options = _service_options(load, load_service)
    names = {f.name for f in dataclasses.fields(p.Load)}
    assert set(options) == names - WORKER_OWN
    assert options["handler"] == "custom.py"
    assert options["gpu_id"] == 1 and options["batch_size"] == 8
    assert options["max_request_size"] == 1234 and options["decode_input_request"] is False


def test_a_field_the_service_does_not_take_is_not_passed() -> None:
    def narrow(model_dir: str, *, batch_size: int = 1) -> None:
        return None

    assert _service_options(p.Load("/m", "m", "1", 4), narrow) == {"batch_size": 4}
