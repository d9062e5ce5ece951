"""Server settings that used to be validated and then ignored: ``enable_metrics_api``,
``workers_start_timeout_s``, the ``cors_allowed_*`` keys, and ``decode_input_request`` (now an
ignored TorchServe key)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from torchbay.server.config.settings import ServerConfig
from torchbay.server.config.sources import load_server_config
from torchbay.server.http.listeners import listener_names

from .conftest import LiveServer, make_config, probe_models

pytestmark = pytest.mark.slow


def test_decode_input_request_is_a_setting_again(tmp_path: Path) -> None:
    # SageMaker's toolkit sets it false and decodes bodies itself (tests/sagemaker; the worker's
    # side: test_model_directories.test_decode_input_request_false_hands_json_and_text_as_bytes).
    path = tmp_path / "config.properties"
    path.write_text("decode_input_request=false\n")
    config, notes = load_server_config(ts_config=path, env={}, cli={})
    assert config.decode_input_request is False
    assert not any("key 'decode_input_request'" in note for note in notes)  # not ignored
    assert ServerConfig().decode_input_request is True  # TorchServe's default
    with pytest.raises(ValidationError):
        ServerConfig(decode_input_request="sometimes")


def test_no_metrics_listener_without_the_metrics_api(model_store: Path) -> None:
    off = make_config(model_store, enable_metrics_api=False)
    assert listener_names(off) == ("inference", "management")
    assert "metrics" in listener_names(make_config(model_store))
    server = LiveServer(off).start()
    try:
        assert server.server.state.ports.metrics == 0
        assert {name for name, _, _ in server.server._servers} == {"inference", "management"}
        assert httpx.get(f"{server.url}/ping", timeout=30).status_code == 200
        assert httpx.get(f"{server.management_url}/models", timeout=30).status_code == 200
    finally:
        server.stop()


def test_startup_models_past_workers_start_timeout_are_reported_failed(model_store: Path) -> None:
    # No worker process starts (spawn, torch import, load) in a millisecond.
    config = make_config(model_store, models=probe_models(), workers_start_timeout_s=0.001)
    server = LiveServer(config).start()
    try:
        assert "workers_start_timeout_s" in server.server.state.failed_models["probe"]
        deadline = time.monotonic() + 60  # it goes on loading, and then serves
        while server.server.state.failed_models and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.server.state.failed_models == {}
        answer = httpx.post(f"{server.url}/predictions/probe", json={"x": 1}, timeout=30)
        assert answer.status_code == 200
    finally:
        server.stop()


def test_startup_models_within_workers_start_timeout_are_not_failed(model_store: Path) -> None:
    server = LiveServer(make_config(model_store, models=probe_models())).start()
    try:
        assert server.server.state.failed_models == {}
    finally:
        server.stop()


def test_cors_headers_on_every_listener_when_configured(model_store: Path) -> None:
    config = make_config(
        model_store,
        cors_allowed_origin="https://app.example",
        cors_allowed_methods="GET, POST, OPTIONS",
        cors_allowed_headers="X-Custom-Header",
    )
    server = LiveServer(config).start()
    origin = {"origin": "https://app.example"}
    try:
        for url in (f"{server.url}/ping", f"{server.management_url}/models",
                    f"{server.metrics_url}/metrics"):  # fmt: skip
            answer = httpx.get(url, headers=origin, timeout=30)
            assert answer.status_code == 200, url
            assert answer.headers["access-control-allow-origin"] == "https://app.example", url
        preflight = httpx.options(
            f"{server.url}/predictions/probe",
            headers={
                **origin,
                "access-control-request-method": "POST",
                "access-control-request-headers": "X-Custom-Header",
            },
            timeout=30,
        )
        assert preflight.status_code == 200
        assert "POST" in preflight.headers["access-control-allow-methods"]
        assert "x-custom-header" in preflight.headers["access-control-allow-headers"].lower()
        other = httpx.get(f"{server.url}/ping", headers={"origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers
    finally:
        server.stop()


def test_no_cors_headers_by_default(model_store: Path) -> None:
    server = LiveServer(make_config(model_store)).start()
    try:
        answer = httpx.get(f"{server.url}/ping", headers={"origin": "https://app.example"})
        assert answer.status_code == 200
        assert "access-control-allow-origin" not in answer.headers
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("value", "threads"),
    [
        *[("3", 3), (" 2 ", 2), ("4,2", 4)],
        *[("0", None), ("-1", None), ("two", None), ("99999", None)],
        *[("", None), (" ", None)],
    ],
)
def test_omp_num_threads_sets_the_threads_per_worker(
    tmp_path: Path, value: str, threads: int | None
) -> None:
    # TorchServe's workers inherit OMP_NUM_THREADS (torch runs that many intra-op threads): it
    # stands for cpu_threads_per_worker. OpenMP's nested form is read at its first level; a value
    # that is no thread count in bounds is named in a warning and the budget's share applies.
    config, notes = load_server_config(
        ts_config=None, env={"OMP_NUM_THREADS": value}, cli={}, cwd=tmp_path
    )
    assert config.cpu_threads_per_worker == threads
    warned = [n for n in notes if n.startswith("WARNING ignored OMP_NUM_THREADS")]
    assert len(warned) == (threads is None and bool(value.strip()))  # empty: as if unset


@pytest.mark.parametrize(
    ("env", "threads"),
    [
        ({"MKL_NUM_THREADS": "1"}, 1),
        ({"MKL_NUM_THREADS": "1", "OMP_NUM_THREADS": "2"}, 1),  # torch: MKL's count wins
        ({"MKL_NUM_THREADS": "0", "OMP_NUM_THREADS": "2"}, 2),  # a bad one: the other
        ({"MKL_NUM_THREADS": "", "OMP_NUM_THREADS": "3"}, 3),
    ],
)
def test_mkl_num_threads_as_torch_reads_it(
    tmp_path: Path, env: dict[str, str], threads: int
) -> None:
    # torch starts MKL_NUM_THREADS intra-op threads, else OMP_NUM_THREADS (what a TorchServe
    # worker runs with: `MKL_NUM_THREADS=1 python -c "import torch; print(torch.get_num_threads())"`
    # prints 1 on a 2-core host, and 1 again with OMP_NUM_THREADS=2).
    config, _ = load_server_config(ts_config=None, env=env, cli={}, cwd=tmp_path)
    assert config.cpu_threads_per_worker == threads


def test_a_declared_cpu_threads_per_worker_beats_omp_num_threads(tmp_path: Path) -> None:
    path = tmp_path / "config.properties"
    path.write_text("cpu_threads_per_worker=2\n")
    env = {"OMP_NUM_THREADS": "1"}
    config, notes = load_server_config(ts_config=path, env=env, cli={})
    assert config.cpu_threads_per_worker == 2
    assert not any("OMP_NUM_THREADS" in note for note in notes)
    config, _ = load_server_config(ts_config=None, env={}, cli={}, cwd=tmp_path / "empty")
    assert config.cpu_threads_per_worker is None  # unset: the budget shares the cores
