"""A server under test: a running one's endpoints and keys (:meth:`Endpoints.at`), or one started
and stopped here (:class:`ManagedServer`, :class:`TorchServeServer`), and its management API."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

import psutil

from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.scenarios import Batching

if TYPE_CHECKING:
    from torchbay.benchmarks.bench import RunOptions

APIS = ("inference", "management", "metrics")
# The scale-model query's name of each of Batching.keys().
QUERY_NAMES = {"batchSize": "batch_size", "maxBatchDelay": "max_batch_delay"}
QUERY_NAMES |= {"minWorkers": "min_worker", "maxWorkers": "max_worker"}


@dataclass(frozen=True)
class Endpoints:
    """Where a server listens and the keys each API wants (None: no auth)."""

    host: str
    inference_port: int
    management_port: int | None = None
    metrics_port: int | None = None
    inference_key: str | None = None
    management_key: str | None = None
    grpc_port: int | None = None  # gRPC inference (a torchbay server started here)

    @classmethod
    def at(cls, options: RunOptions) -> Endpoints:
        """``bench run --url``'s server: its URLs, and its keys from the key file or one token."""
        keys = read_key_file(options.key_file) if options.key_file else (options.token, None)
        ports = [
            parse_url(u)[1] if u else None for u in (options.management_url, options.metrics_url)
        ]
        return cls(*parse_url(options.url or ""), *ports, keys[0], keys[1] or options.token)


def read_key_file(path: str | Path) -> tuple[str | None, str | None]:
    """(inference key, management key) from TorchServe's ``key_file.json``."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise BenchError(f"cannot read key file {path}: {exc}") from None
    entries = [data.get(api) or {} for api in APIS[:2]]
    inference, management = (e.get("key") if isinstance(e, dict) else None for e in entries)
    return inference, management


def parse_url(url: str) -> tuple[str, int]:
    """(host, port) of an ``http://`` URL; https (plain HTTP/1.1 only) and a path (the bench
    sends to its own routes) are refused."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.path.strip("/") or parts.query:
        raise BenchError(f"{url!r}: give an http://host:port URL, without a path")
    return parts.hostname, parts.port or 80


def bearer(key: str | None) -> dict[str, str]:
    """The ``Authorization`` header an API key asks for (none without a key)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def http_call(
    host: str,
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 5.0,
) -> tuple[int, bytes]:
    """One request on a fresh connection: (status, body). BenchError when it cannot be made."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body, headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    except OSError as exc:
        raise BenchError(f"{method} http://{host}:{port}{path}: {exc}") from None
    finally:
        conn.close()


class Management:
    """A small client of the management API."""

    def __init__(self, host: str, port: int, key: str | None = None, timeout: float = 120.0):
        self.host, self.port, self.key, self.timeout = host, port, key, timeout

    def _call(self, method: str, model: str, version: str | None, query: str = "") -> Any:
        """The JSON (or text) of a 200 answer to ``/models/MODEL[/VERSION][?query]``."""
        path = f"/models/{model}" + (f"/{version}" if version else "") + query
        headers = bearer(self.key)
        status, raw = http_call(self.host, self.port, method, path, None, headers, self.timeout)
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        if status != 200 or (method == "GET" and not (isinstance(body, list) and body)):
            raise BenchError(f"{method} {path} answered {status}: {body}")
        return body

    def describe(self, model: str, version: str | None = None) -> dict[str, Any]:
        return self._call("GET", model, version)[0]

    def configure(self, model: str, version: str | None, settings: Batching) -> None:
        """Apply ``settings`` live and wait until the workers are up (synchronous scale)."""
        keys = settings.keys()
        query = {"synchronous": "true", **{QUERY_NAMES[k]: v for k, v in keys.items()}}
        self._call("PUT", model, version, "?" + urlencode(query))
        # Read the settings back: a server that ignored them would make the search a lie.
        asked = {k: v for k, v in keys.items() if k in ("batchSize", "maxBatchDelay")}
        info = self.describe(model, version) if asked else {}
        for key, want in asked.items():
            if (got := info.get(key)) is None or abs(float(got) - want) > 1e-6:
                raise BenchError(f"the server kept {key}={got} after asking for {want}")


@dataclass
class ManagedServer:
    """``command`` (plus ``--ready-file``) started in ``run_dir``, ready when it writes the ready
    file (``torchbay serve`` and the ceilings both do), stopped with its tree; keys from the run
    folder's ``key_file.json`` when ``auth`` is on. ``tmp_dir``, when set, goes at the stop."""

    command: list[str]
    run_dir: Path
    auth: bool = False
    start_timeout_s: float = 120.0
    proc: subprocess.Popen | None = None
    endpoints: Endpoints | None = None
    started_at: float = 0.0
    tmp_dir: str | None = None
    _log: Any = field(default=None, repr=False)

    @classmethod
    def torchbay(
        cls,
        archive: Path,
        run_dir: Path,
        *,
        auth: bool = True,
        extra_args: tuple[str, ...] = (),
        python: str = sys.executable,
        models: tuple[str, ...] = (),
    ) -> ManagedServer:
        """``torchbay serve`` for one archive on port 0 for all three listeners; ``models``
        (``name=file.mar`` each, from the archive's folder) replaces the archive when it is served
        under another name (a ``--ts-config`` entry's) or the store serves several."""
        if not archive.exists():
            raise BenchError(f"{archive}: no such archive")
        archive = archive.resolve()
        cmd = [
            *(python, "-m", "torchbay", "serve", "--ncs", "--model-store", str(archive.parent)),
            "--models",
            *(models or (archive.name,)),
            *(arg for api in APIS for arg in (f"--{api}-address", "http://127.0.0.1:0")),
            *(() if auth else ("--disable-token-auth",)),
            *extra_args,
        ]
        return cls(cmd, run_dir, auth=auth)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def __enter__(self) -> Endpoints:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Endpoints:
        """Start the server and wait until it is ready; BenchError (and the server stopped) if it
        exits first, reports a failed model, or is not ready within ``start_timeout_s``."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._log = (self.run_dir / "server.log").open("wb")
        self.started_at = time.monotonic()
        command, env = self._launch()
        # Its own session: a Ctrl-C halts the load and reports it, then stops the server.
        self.proc = subprocess.Popen(
            command,
            cwd=self.run_dir,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            self.endpoints = self._wait_ready()
        except BenchError:
            self.stop()
            raise
        return self.endpoints

    def _launch(self) -> tuple[list[str], dict[str, str]]:
        """The command line and environment: gRPC on free ports (never 7070/7071 of another
        server), and a fresh ready file to wait for (absolute: the server runs in ``run_dir``)."""
        ready_file = self.run_dir.resolve() / "ready.json"
        ready_file.unlink(missing_ok=True)
        free_grpc = {f"TORCHBAY_GRPC_{k}_PORT": "0" for k in ("INFERENCE", "MANAGEMENT")}
        return [*self.command, "--ready-file", str(ready_file)], {**free_grpc, **os.environ}

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the server, wait ``grace_s``, then kill it and any descendant left behind."""
        if self.proc is not None:
            try:
                children = psutil.Process(self.proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                children = []
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(grace_s)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            for child in psutil.wait_procs(children, timeout=5)[1]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.tmp_dir is not None:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
            self.tmp_dir = None

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the server's log (empty if it has none)."""
        path = self.run_dir / "server.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def _poll(self, ready: Callable[[], bool], interval_s: float, timeout_s: float = 0.0) -> None:
        """Poll ``ready`` until it holds; BenchError if the server exits first or ``timeout_s``
        passes (0: the start timeout, from the start; the poll only bounds the wait)."""
        assert self.proc is not None
        start = time.monotonic() if timeout_s else self.started_at
        timeout_s = timeout_s or self.start_timeout_s
        while not ready():
            if self.proc.poll() is not None:
                raise BenchError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > start + timeout_s:
                raise BenchError(f"server not ready in {timeout_s:.0f} s:\n{self.log_tail()}")
            time.sleep(interval_s)

    def _wait_ready(self) -> Endpoints:
        ready_file = self.run_dir / "ready.json"
        self._poll(ready_file.exists, 0.01)
        ready = json.loads(ready_file.read_text())
        if ready.get("failed_models"):
            raise BenchError(f"model failed to load: {ready['failed_models']}\n{self.log_tail()}")
        keys = (None, None)
        if self.auth:
            keys = read_key_file(self.run_dir / "key_file.json")
        ports = (ready["inference"], ready.get("management"), ready.get("metrics"))
        return Endpoints("127.0.0.1", *ports, *keys, ready.get("grpc_inference"))

    def first_answer(self, path: str, body: bytes, timeout_s: float = 30.0) -> float:
        """POST ``body`` to ``path`` until it answers 200; seconds since the process started."""
        e = self.endpoints
        assert e is not None
        headers = {"Content-Type": "application/octet-stream", **bearer(e.inference_key)}

        def answered() -> bool:
            try:
                return http_call(e.host, e.inference_port, "POST", path, body, headers)[0] == 200
            except BenchError:
                return False  # not listening yet

        self._poll(answered, 0.01, timeout_s)
        return time.monotonic() - self.started_at


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel reports free now (TorchServe cannot bind port 0 and say which it got)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def find_torchserve(spec: str | Path | None) -> Path | None:
    """The ``torchserve`` script of ``spec`` (a venv, its bin/ or the script); None if absent."""
    if not spec:
        return None
    path = Path(spec).expanduser()
    for candidate in (path, path / "torchserve", path / "bin" / "torchserve"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate.resolve()
    return None


def write_properties(
    run_dir: Path, models_json: dict[str, Any], props: dict[str, Any], *head: str
) -> Path:
    """``run_dir/config.properties``: ``head``, then the ``models={...}`` and ``props`` that
    torchbay and TorchServe both get."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [*head, f"models={json.dumps(models_json)}", *(f"{k}={v}" for k, v in props.items())]
    config = run_dir / "config.properties"
    config.write_text("\n".join(lines) + "\n")
    return config


@dataclass
class TorchServeServer(ManagedServer):
    """TorchServe 0.12 with ``--foreground`` (stopping its tree stops the JVM and workers), ready
    when every model's workers are READY. ``TMPDIR``/``TEMP`` (java.io.tmpdir) are a private folder:
    its pid file and worker sockets (``.ts.sock.9000``) would clash in a shared /tmp."""

    models: tuple[str, ...] = ()

    @classmethod
    def build(
        cls,
        torchserve: Path,
        model_store: Path,
        models: dict[str, str],
        run_dir: Path,
        models_json: dict[str, Any],
        extra: dict[str, Any] | None = None,
    ) -> TorchServeServer:
        """``models`` maps a model name to its ``.mar`` in ``model_store``. Its config: loopback
        ports, free gRPC ports (its defaults, 7070/7071, may be another server's on a shared
        host) and Prometheus metrics (log mode is slower)."""
        ports = {api: free_port() for api in APIS}
        head = [f"{api}_address=http://127.0.0.1:{port}" for api, port in ports.items()]
        head += [*(f"grpc_{api}_port={free_port()}" for api in APIS[:2]), "metrics_mode=prometheus"]
        config = write_properties(run_dir, models_json, extra or {}, *head)
        cmd = [
            str(torchserve),
            *("--start", "--foreground", "--ncs", "--disable-token-auth", "--enable-model-api"),
            *("--model-store", str(model_store.resolve())),
            *("--ts-config", str(config.resolve())),
            "--models",
            *(f"{name}={mar}" for name, mar in models.items()),
        ]
        server = cls(cmd, run_dir, models=tuple(models))
        server.endpoints = Endpoints("127.0.0.1", *ports.values())
        return server

    def _launch(self) -> tuple[list[str], dict[str, str]]:
        self.tmp_dir = tempfile.mkdtemp(prefix="tbts-")  # short: a socket path has <= 107 bytes
        return self.command, {**os.environ, "TMPDIR": self.tmp_dir, "TEMP": self.tmp_dir}

    def _wait_ready(self) -> Endpoints:
        e = self.endpoints
        assert e is not None and e.management_port is not None
        client = Management(e.host, e.management_port, timeout=2.0)

        def ready() -> bool:
            try:
                workers = [client.describe(name).get("workers") or [] for name in self.models]
            except BenchError:
                return False
            return all(ws and all(w.get("status") == "READY" for w in ws) for ws in workers)

        self._poll(ready, 0.05)
        return e
