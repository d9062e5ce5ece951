"""Live-server fixtures: real uvicorn listeners on 127.0.0.1 port 0, real worker processes,
real archives built by our archiver. Readiness comes from the server's own event, never sleeps.

Sibling modules are imported inside the fixtures that need them, never at the top (live.py
only by its absolute name): the examples' conftest loads this file by path, outside the package."""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import httpx
import pytest
import torch

from tests.server.live import (
    LiveServer,
    batch_running,
    longest_gap,
    ran_ids,
    until,
)
from torchbay.archiver.package import ArchiveOptions, package
from torchbay.server.config.settings import ServerConfig

__all__ = [
    "LiveServer",
    "batch_running",
    "longest_gap",
    "ran_ids",
    "until",
]  # what tests import from here

ASSETS = Path(__file__).parent / "assets"


def _tiny_model(path: Path) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    torch.jit.save(torch.jit.script(model.eval()), str(path))
    return path


@pytest.fixture(scope="session")
def model_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model store with ``probe.mar`` (the probe handler over a tiny TorchScript model) and
    ``tiny.mar`` (the built-in tensor handler)."""
    return build_store(
        tmp_path_factory, "store", {"probe": str(ASSETS / "probe_handler.py"), "tiny": "tensor"}
    )


def build_store(
    tmp_path_factory: pytest.TempPathFactory,
    prefix: str,
    handlers: dict[str, str],
    config_files: dict[str, Path] | None = None,
) -> Path:
    """A fresh model store with one version-1.0 archive per ``name: handler``, each over the
    seeded tiny TorchScript model (``_tiny_model``); ``config_files`` gives an archive its
    model-config.yaml. A handler file of assets/ gets assets/gates.py beside it (the gate
    handlers import it)."""
    root = tmp_path_factory.mktemp(prefix)
    work = tmp_path_factory.mktemp(f"{prefix}-build")
    for name, handler in handlers.items():
        ours = Path(handler).parent == ASSETS
        tiny_archive(
            work,
            root,
            name,
            handler,
            extra_files=(str(ASSETS / "gates.py"),) if ours else (),
            config_file=(config_files or {}).get(name),
        )
    return root


def recorded_store(
    factory: pytest.TempPathFactory,
    prefix: str,
    archives: dict[str, tuple[str, str, str]],
    data: Path,
) -> Path:
    """A TorchServe recorder's model store (``archives``: file name -> model name, version,
    handler file in ``data``), built by torchbay's archiver from the same handler files."""
    root, work = factory.mktemp(prefix), factory.mktemp(f"{prefix}-build")
    for file_name, (name, version, handler) in archives.items():
        built = tiny_archive(work, work / file_name, name, str(data / handler), version=version)
        shutil.move(built, root / file_name)
    return root


def tiny_archive(work: Path, export: Path, name: str, handler: str, **options: Any) -> Path:
    """``name`` (version 1.0 unless ``options`` say otherwise) with ``handler`` over the seeded
    tiny TorchScript model (``_tiny_model``, saved in ``work``), packed by our archiver into
    ``export``; the archive's path."""
    options = {"version": "1.0", **options}
    model = _tiny_model(work / "model.pt")
    return package(
        ArchiveOptions(
            model_name=name, serialized_file=model, handler=handler, export_path=export, **options
        )
    )


def scripted_archive(
    module: torch.nn.Module, name: str, work: Path, export: Path, **options: Any
) -> Path:
    """``module`` scripted (in eval mode) into ``work`` and packed by our archiver into
    ``export`` as ``name`` version 1 with the tensor handler (``options`` add to or replace
    those fields); the archive's path."""
    serialized = work / f"{name}.pt"
    torch.jit.save(torch.jit.script(module.eval()), str(serialized))
    fields = {"version": "1", "handler": "tensor", **options}
    return package(
        ArchiveOptions(model_name=name, serialized_file=serialized, export_path=export, **fields)
    )


@pytest.fixture(scope="module")
def oip_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The store of :func:`oip_store.build_oip_store`: archives with recorded signatures."""
    from .oip_store import build_oip_store

    return build_oip_store(tmp_path_factory.mktemp("oip"), tmp_path_factory.mktemp("oip-work"))


@pytest.fixture(scope="module")
def talk_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model store holding ``talk.mar``, whose handler prints (cli_helpers.TALK_HANDLER): for
    the tests of the ``torchbay`` command."""
    from .cli_helpers import build_talk_store  # (cli_helpers imports this module, too)

    return build_talk_store(tmp_path_factory, "talk")


def recorded(data: Path, module: str) -> tuple[ModuleType, dict[str, Any]]:
    """A TorchServe record of tests/data: the recorder's standard-library ``module`` in ``data``
    (its steps and normalisation, loaded from its file: tests/data is no package) and the
    ``answers.json`` beside it."""
    name = "recorded_" + data.name.replace(".", "_")
    spec = importlib.util.spec_from_file_location(name, data / module)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded, json.loads((data / "answers.json").read_text())


@pytest.fixture
def cli_run(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """(working directory, environment with its own TMPDIR) for a test that runs the
    ``torchbay`` command; afterwards kills what the pid file names (a server left started)."""
    from .cli_helpers import PID_FILE, clean_env, kill_tree

    cwd = tmp_path / "run"
    cwd.mkdir()
    env = clean_env(tmp_path / "tmp")
    yield cwd, env
    pid_file = tmp_path / "tmp" / PID_FILE
    if pid_file.exists():
        kill_tree(int(pid_file.read_text()))


def tensor_archive(root: Path, name: str, model: Path, example: Path, **options: Any) -> Path:
    """``name`` (version 1, the tensor handler unless ``options`` say otherwise) packed by our
    archiver from ``model`` and its ``example`` input into ``root``; the archive's path."""
    options = {"version": "1", "handler": "tensor", **options}
    spec = ArchiveOptions(
        model_name=name, serialized_file=model, example_input=example, export_path=root, **options
    )
    return package(spec)


@contextlib.contextmanager
def stream_server(factory: pytest.TempPathFactory, name: str) -> Iterator[LiveServer]:
    """A LiveServer of ``stream.mar`` (assets/stream_handler.py, version 1.0, the default)."""
    store = build_store(factory, name, {"stream": str(ASSETS / "stream_handler.py")})
    models = {"stream": {"1.0": {"marName": "stream.mar", "defaultVersion": True}}}
    live = LiveServer(make_config(store, models=models)).start()
    try:
        yield live
    finally:
        live.stop()


@contextlib.contextmanager
def running(
    store: Path, *, gpu_count: int | None = None, uvloop: bool = True, **overrides: Any
) -> Iterator[LiveServer]:
    """A LiveServer over ``store`` (``make_config(store, **overrides)``), stopped on leaving;
    ``gpu_count``: the GPUs it sees (the seam), else those detected; ``uvloop``: LiveServer's."""
    config = make_config(store, **overrides)
    live = LiveServer(config, gpu_count=gpu_count, uvloop=uvloop).start()
    try:
        yield live
    finally:
        live.stop()


@contextlib.contextmanager
def handler_ports(tmp_path: Path, name: str, handler: Path) -> Iterator[Any]:
    """The ports of a LiveServer that loaded ``name``.mar at start-up: ``handler`` over the tiny
    model, packed by our archiver in ``tmp_path`` (a TorchServe recorder's handler, asked what
    TorchServe was asked)."""
    store = tmp_path / "store"
    store.mkdir()
    tiny_archive(tmp_path, store, name, str(handler))
    with running(store, load_models=[f"{name}.mar"]) as server:
        yield server.server.state.ports


def load_gated_store(
    factory: pytest.TempPathFactory,
    tmp_path: Path,
    prefix: str,
    name: str = "gated",
    gate: Path | None = None,
) -> tuple[Path, Path]:
    """A store with ``name``.mar of the load-gate handler (assets/load_gate_handler.py): each of
    its workers' loads creates ``tmp_path/load-started``, then waits while ``gate`` is absent
    (None: a gate never opened, so the load is held 60 s). The store and that started file."""
    started = tmp_path / "load-started"
    yaml = tmp_path / f"{name}.yaml"
    yaml.write_text(f"loadStarted: {started}\nloadGate: {gate or tmp_path / 'never'}\n")
    handler = str(ASSETS / "load_gate_handler.py")
    return build_store(factory, prefix, {name: handler}, {name: yaml}), started


@contextlib.contextmanager
def gate_server(
    factory: pytest.TempPathFactory, prefix: str, models: dict[str, Any]
) -> Iterator[LiveServer]:
    """A LiveServer of ``models`` (``models={...}``), each name an archive of the gate handler
    (assets/gate_handler.py), all loaded."""
    handler = str(ASSETS / "gate_handler.py")
    store = build_store(factory, prefix, dict.fromkeys(models, handler))
    with running(store, models=models, load_models=["all"]) as live:
        yield live


@contextlib.contextmanager
def oip_client(server: LiveServer, protocol: str, *clear: str) -> Iterator[Any]:
    """tritonclient's ``protocol`` ("http" or "grpc") client of ``server``, closed on leaving;
    ``clear`` names the shared-memory registrations ("system", "cuda") it drops before and
    after (a test's regions must not outlive it on a module's server)."""
    if protocol == "http":
        import tritonclient.http as triton_http

        client = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
    else:
        import tritonclient.grpc as triton_grpc

        port = server.server.state.ports.grpc_inference
        client = triton_grpc.InferenceServerClient(f"127.0.0.1:{port}")
    drops = [getattr(client, f"unregister_{kind}_shared_memory") for kind in clear]
    try:
        for drop in drops:
            drop()
        yield client
        for drop in drops:
            drop()
    finally:
        client.close()


@pytest.fixture
def oip_http(server: LiveServer) -> Iterator[Any]:
    """tritonclient's HTTP client of the module's ``server`` fixture."""
    with oip_client(server, "http") as client:
        yield client


@pytest.fixture
def oip_grpc(server: LiveServer) -> Iterator[Any]:
    """tritonclient's gRPC client of the module's ``server`` fixture."""
    with oip_client(server, "grpc") as client:
        yield client


def with_metrics_logs(
    factory: pytest.TempPathFactory, prefix: str, param: str, run: Callable[[Path], Any]
) -> tuple[str, Any]:
    """``(param, run(logs))``, METRICS_LOCATION set to ``logs``, a fresh folder of its own
    meanwhile: a module fixture's run of a TorchServe metrics recording, one per parameter."""
    logs = factory.mktemp(f"{prefix}-{param}")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("METRICS_LOCATION", str(logs))
        return param, run(logs)


def make_config(store: Path, **overrides: Any) -> ServerConfig:
    settings: dict[str, Any] = {
        "model_store": store,
        "inference_address": "http://127.0.0.1:0",
        "management_address": "http://127.0.0.1:0",
        "metrics_address": "http://127.0.0.1:0",
        "grpc_inference_port": 0,  # gRPC always listens (as TorchServe): any free ports
        "grpc_management_port": 0,
        "disable_token_authorization": True,
        "shutdown_grace_s": 10,
    }
    settings.update(overrides)
    return ServerConfig.model_validate(settings)


@pytest.fixture
def live_server(model_store: Path) -> Iterator[Any]:
    """Call ``live_server(load_models=[...], models={...}, ...)`` to start a server."""
    servers: list[LiveServer] = []

    def start(
        *, gpu_count: int | None = None, cores: int | None = None, **overrides: Any
    ) -> LiveServer:
        kwargs: dict[str, Any] = {"gpu_count": gpu_count} if gpu_count is not None else {}
        if cores is not None:
            kwargs["cores"] = cores
        server = LiveServer(make_config(model_store, **overrides), **kwargs).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def probe_models(**settings: Any) -> dict[str, Any]:
    """``models={...}`` for the probe archive with TorchServe's camelCase settings."""
    return {"probe": {"1.0": {"marName": "probe.mar", "defaultVersion": True, **settings}}}


async def post_json(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> httpx.Response:
    return await client.post(url, json=body)


@pytest.fixture(scope="session")
def versioned_store(model_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model store with ``probe.mar`` (version 1.0), ``probe-v2.mar`` (the same probe model
    as version 2.0) and ``tiny.mar``: for side-by-side versions."""
    import shutil

    root = tmp_path_factory.mktemp("versioned-store")
    for name in ("probe.mar", "tiny.mar"):
        shutil.copy(model_store / name, root / name)
    work = tmp_path_factory.mktemp("build-v2")
    built = tiny_archive(work, work, "probe", str(ASSETS / "probe_handler.py"), version="2.0")
    shutil.move(built, root / "probe-v2.mar")
    return root


@pytest.fixture(scope="session")
def ts_stubs() -> Iterator[SimpleNamespace]:
    """TorchServe's inference and management stubs, generated from the shipped .proto files."""
    import grpc_tools
    from grpc_tools import protoc

    from torchbay.server.grpc import messages

    out = Path(tempfile.mkdtemp(prefix="ts-stubs-"))
    include = Path(grpc_tools.__file__).parent / "_proto"
    for proto in ("inference.proto", "management.proto", "google/rpc/status.proto"):
        args = ["protoc", f"-I{messages.PROTOS}", f"-I{include}", f"--python_out={out}"]
        assert protoc.main([*args, f"--grpc_python_out={out}", proto]) == 0, proto
    sys.path.insert(0, str(out))
    try:
        names = ("inference_pb2", "inference_pb2_grpc", "management_pb2", "management_pb2_grpc")
        yield SimpleNamespace(**{n: importlib.import_module(n) for n in names})
    finally:
        sys.path.remove(str(out))


@contextlib.contextmanager
def errors_left_in_cycles() -> Iterator[list[Any]]:
    """The server's errors (TorchbayError) that only the garbage collector freed while the
    block ran: the list is filled when the block ends. A cycle per answered request would
    make the collector run every few dozen requests under overload."""
    from torchbay.server.errors import TorchbayError

    left: list[Any] = []
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds is kept in gc.garbage to look at
    try:
        yield left
        gc.collect()
        left.extend(o for o in gc.garbage if isinstance(o, TorchbayError))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
