"""Fast start (issue 15 item 4, issue 31 item 1): ``serve`` starts its worker template before
its own imports, the frontend never loads torch, and nothing idle holds up the ready file.

Structural checks only (what is imported, which process maps what), never timings."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from torchbay.server.early_workers import _serves_models

from .cli_helpers import (
    build_talk_store,
    clean_env,
    free_addresses,
    kill_tree,
    predict,
    read_ready,
    spawned_workers,
)

# Heavy frontend imports that must not come before the first worker is spawned.
_HEAVY = ("torch", "pydantic", "fastapi", "uvicorn", "grpc", "httpx", "yaml", "asyncio")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["serve", "--models", "a.mar"], True),
        (["--debug", "serve", "--ts-config=x.properties"], True),
        (["serve", "--start", "--foreground", "--models", "a.mar"], True),
        (["serve", "--start", "--daemon-fd", "5", "--models", "a.mar"], True),  # --start's child
        (["serve", "--start", "--models", "a.mar"], False),  # --start's parent serves nothing
        (["serve", "--stop"], False),
        (["serve", "--models", "a.mar", "--help"], False),
        (["serve", "--model-store", "s"], False),  # no start-up models: no worker to warm
        (["models", "list"], False),
        ([], False),
    ],
)
def test_which_commands_spawn_a_worker_first(argv, expected):
    assert _serves_models(argv) is expected


def test_the_template_is_started_before_the_frontends_heavy_imports(tmp_path):
    code = (
        "import sys\n"
        "from torchbay.server.early_workers import spawn_early\n"
        "early = spawn_early(['serve', '--models', 'a.mar', '--log-format', 'json'])\n"
        f"print(sorted(m for m in {_HEAVY!r} if m in sys.modules))\n"
        "proc, sock, env = early.template\n"
        "print(early.spawned, early.log_format, proc.poll(), 'template' in proc.args[2])\n"
        "early.close()\n"
        "print(early.template, proc.poll() is not None and early.read_fd == -1)\n"
    )
    env = clean_env(tmp_path / "tmp")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    heavy, started, closed = out.stdout.splitlines()
    assert heavy == "[]"  # none of them loaded when the template started
    assert started == "[] json None True"  # the template, running, told the flags' log format
    assert closed == "None True"  # close() stops a template nobody adopted


@pytest.mark.parametrize("template", [False, True])
def test_the_early_process_runs_what_the_server_runs(template):
    """spawn_early starts its template (its worker, where workers cannot be forked) without
    serving.forkserver and serving.spawning, through the one worker_env.start_worker they use:
    the same command line as the server's (the socket's fd number aside)."""
    from torchbay.server.early_workers import _start
    from torchbay.server.serving import forkserver
    from torchbay.server.serving.handle import spawn_process

    early, _ = _start("json", 1, template=template)
    try:
        ours = list(early.proc.args)
        if template:
            forks = forkserver.ForkServer(log_format="json")
            forks.start()  # the server's own template
            try:
                reference = list(forks._template.proc.args)
            finally:
                forks.close()
        else:
            theirs = spawn_process(log_format="json")
            try:
                reference = list(theirs.proc.args)
            finally:
                theirs.proc.kill()
                theirs.discard()
    finally:
        early.proc.kill()
        early.proc.wait()
        early.sock.close()
    fd = ours.index("--fd") + 1
    ours[fd] = reference[fd] = "N"
    assert ours == reference


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps")
@pytest.mark.parametrize("models", [["talk=talk.mar"], ["talk=talk.mar", "again=talk.mar"]])
def test_serve_forks_from_the_early_template_and_never_maps_torch(
    tmp_path, tmp_path_factory, models
):
    """No worker spawned for the start-up models: each forks from the template the CLI started
    before its imports (adopted: no second template), its log lines in model_log.log (the
    template's stdout is the CLI's early pipe; a fork writes to the frontend's), the archive
    unpacked once, and no libtorch in the frontend."""
    store, logs = build_talk_store(tmp_path_factory, "talk-early"), tmp_path / "logs"
    with _serve(tmp_path, store, models, LOG_LOCATION=str(logs)) as (proc, info):
        assert info["failed_models"] == {}
        assert info["grpc_inference"] > 0
        assert predict(info["inference"]).status_code == 200
        assert spawned_workers(proc.pid) == []
        [template] = psutil.Process(proc.pid).children()
        assert "torchbay.server.worker.template" in template.cmdline()
        forked = template.children()
        assert len(forked) == len(models)
        front = Path(f"/proc/{proc.pid}/maps").read_text()
        assert "libtorch" not in front
        assert "libtorch" in Path(f"/proc/{forked[0].pid}/maps").read_text()
        # The archive was unpacked once (TMPDIR is the test's: the registry's work folder).
        unpacked = list((tmp_path / "tmp").glob("torchbay-models-*/talk-*"))
        assert len(unpacked) == 1, unpacked
        model_log = (logs / "model_log.log").read_text()
        for worker in forked:  # its output reached WorkerOutput
            assert f"worker[{worker.pid}]" in model_log, model_log


@pytest.mark.slow
def test_worker_start_spawn_stops_the_early_template_and_spawns(tmp_path, tmp_path_factory):
    """``worker_start=spawn`` in the config: the CLI's early template is stopped, the start-up
    worker is spawned (the server's child), and no template is left."""
    store = build_talk_store(tmp_path_factory, "talk-early")
    with _serve(tmp_path, store, ["talk=talk.mar"], "worker_start=spawn\n") as (proc, info):
        assert predict(info["inference"]).status_code == 200
        children = psutil.Process(proc.pid).children()
        assert [w.pid for w in spawned_workers(proc.pid)] == [c.pid for c in children]
        assert len(children) == 1 and "torchbay.server.worker" in children[0].cmdline()


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc/PID/environ")
def test_blacklisted_variables_never_reach_the_template_the_workers_fork_from(
    tmp_path, tmp_path_factory
):
    """``blacklist_env_vars``: the CLI's early template, started with every variable before the
    config was read, is stopped; the server's own template (and so each forked worker's
    /proc/PID/environ, which is the template's) never had the hidden ones."""
    store = build_talk_store(tmp_path_factory, "talk-early")
    hidden = {"TB_HIDDEN_SECRET": "x", "TB_SHOWN_SETTING": "on"}
    config = "blacklist_env_vars=TB_HIDDEN_.*\n"
    with _serve(tmp_path, store, ["talk=talk.mar"], config, **hidden) as (proc, info):
        assert predict(info["inference"]).status_code == 200
        [template] = psutil.Process(proc.pid).children()
        assert "torchbay.server.worker.template" in template.cmdline()
        [worker] = template.children()  # forked
        for pid in (template.pid, worker.pid):
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert b"TB_SHOWN_SETTING=on" in environ
            assert not any(v.startswith(b"TB_HIDDEN_SECRET=") for v in environ)


@pytest.mark.slow
def test_a_config_that_names_no_model_leaves_no_worker_running(tmp_path):
    """``--ts-config`` that names no model: no worker process is left running (the template the
    CLI started on spec is the server's, which would start one anyway)."""
    store = tmp_path / "store"
    store.mkdir()
    with _serve(tmp_path, store, []) as (proc, info):
        assert info["failed_models"] == {}
        assert spawned_workers(proc.pid) == []


@contextlib.contextmanager
def _serve(
    tmp_path: Path, store: Path, models: list[str], config: str = "", **env: str
) -> Iterator[tuple[subprocess.Popen, dict]]:
    """``torchbay serve`` over ``store`` with ``models`` (``--models``; none: the config's),
    ``config`` in its config.properties (gRPC on free ports), ``env`` over a clean environment:
    (the process, its ready file) once ready; then stopped, and it exits 0."""
    cwd = tmp_path / "run"
    cwd.mkdir()
    (cwd / "config.properties").write_text(
        "grpc_inference_port=0\ngrpc_management_port=0\n" + config
    )
    ready = cwd / "ready.json"
    args = [
        "serve",
        "--ncs",
        "--model-store",
        str(store),
        *(["--models", *models] if models else []),
    ]
    args += ["--ts-config", "config.properties", "--disable-token-auth", "--ready-file", str(ready)]
    with (cwd / "console.log").open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "torchbay", *args, *free_addresses()],
            cwd=cwd,
            env=clean_env(tmp_path / "tmp", **env),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_ready(proc, ready, cwd)
        yield proc, read_ready(ready)
        proc.terminate()
        assert proc.wait(timeout=60) == 0
    finally:
        kill_tree(proc.pid)


def _wait_ready(proc: subprocess.Popen, ready: Path, cwd: Path) -> None:
    """Until the server writes its ready file (fails with its console if it exits first)."""
    deadline = time.monotonic() + 100
    while not ready.exists():
        assert proc.poll() is None, (cwd / "console.log").read_text()
        assert time.monotonic() < deadline, "never became ready"
        time.sleep(0.05)


def test_a_worker_serving_an_archive_without_a_tensor_signature_never_imports_pydantic(tmp_path):
    """pydantic (through archiver.signature) was ~0.1 s of a worker's start: a TorchServe .mar
    has no signature, so its worker must not pay for it; one that has a signature still does."""
    code = (
        "import sys\n"
        "import torchbay.server.worker.main, torch, torchbay.handlers.runtime.service\n"
        "from torchbay.handlers import oip_signature\n"
        "print(oip_signature.load({'torchbay': {'inputs': None, 'input_shape': None}}, {}),"
        " 'pydantic' in sys.modules)\n"
        "signature = oip_signature.load({'torchbay': {'input_shape': [4]}}, None)\n"
        "print([s.name for s in signature.inputs], 'pydantic' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=clean_env(tmp_path / "tmp"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["None False", "['input0'] True"]


@pytest.mark.parametrize(
    ("info", "yaml_config"),
    [
        (None, None),
        ({}, {}),
        ({"inputs": None, "outputs": None, "input_shape": None}, {"batchSize": 4}),
        ({"input_shape": []}, None),
        ({"inputs": []}, None),
        ({"outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}]}, None),
        ({"input_shape": [3], "input_dtype": "float16"}, None),
        ({}, {"inputs": [{"name": "x", "datatype": "INT64", "shape": [-1]}]}),
        ({}, {"outputs": []}),
    ],
)
def test_the_worker_skips_the_signature_only_where_model_signature_finds_none(info, yaml_config):
    from torchbay.archiver.signature import model_signature
    from torchbay.handlers import oip_signature

    manifest = {} if info is None else {"torchbay": info}
    assert oip_signature.load(manifest, yaml_config) == model_signature(info, yaml_config)


@pytest.mark.parametrize(("log_format", "forking"), [("json", False), ("text", True)])
def test_an_early_template_the_server_cannot_use_is_stopped(log_format, forking):
    """``worker_start=spawn``, or another log format in the config than the flags said: the
    template is stopped at once, and the server starts its own workers."""
    from torchbay.server.early_workers import spawn_early

    early = spawn_early(["serve", "--models", "a.mar", "--log-format=json"])
    assert early is not None and early.template is not None
    proc = early.template[0]
    assert early.adopt(log_format, forking) == ([], None)
    assert proc.poll() is not None and early.read_fd == -1 and early.forwarder is None
