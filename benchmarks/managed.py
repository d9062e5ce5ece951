"""A server under test: endpoints and keys of a running one, or one started from an archive.

:class:`ManagedServer` starts ``python -m torchbay serve`` on port 0 for all three listeners, with
token auth on (keys read from the ``key_file.json`` it writes in its run folder), waits for its
``--ready-file`` (written once the startup model loaded; a model that failed to load is an error),
and stops the whole process tree at the end. :class:`Management` talks to the management API:
describe a model, and set batch size, delay and worker count live (``PUT /models/{m}/{v}``).
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from torchbay.benchmarks import procstat
from torchbay.benchmarks.errors import BenchError


@dataclass(frozen=True)
class Endpoints:
    """Where a server listens and the keys each API wants (None: no auth)."""

    host: str
    inference_port: int
    management_port: int | None = None
    metrics_port: int | None = None
    inference_key: str | None = None
    management_key: str | None = None


def read_key_file(path: str | Path) -> tuple[str | None, str | None]:
    """(inference key, management key) from TorchServe's ``key_file.json``."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise BenchError(f"cannot read key file {path}: {exc}") from None
    keys = []
    for api in ("inference", "management"):
        entry = data.get(api) or {}
        keys.append(entry.get("key") if isinstance(entry, dict) else None)
    return keys[0], keys[1]


def parse_url(url: str) -> tuple[str, int, str]:
    """(host, port, path) of an ``http://`` URL; https is refused (the generator speaks plain
    HTTP/1.1 on loopback or a trusted network)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise BenchError(f"{url!r}: give an http://host:port URL")
    port = parts.port or 80
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return parts.hostname, port, path


@dataclass(frozen=True)
class ModelSettings:
    """Batching and scale of one model version; None leaves a setting as it is."""

    batch_size: int | None = None
    max_batch_delay_ms: float | None = None
    workers: int | None = None

    def label(self) -> str:
        return f"b{self.batch_size}-d{self.max_batch_delay_ms:g}-w{self.workers}"


class Management:
    """A small client of the management API."""

    def __init__(self, host: str, port: int, key: str | None = None, timeout: float = 120.0):
        self.host, self.port, self.key, self.timeout = host, port, key, timeout

    def _call(self, method: str, path: str) -> tuple[int, Any]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        try:
            conn.request(method, path, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        except OSError as exc:
            raise BenchError(f"management API {method} {path}: {exc}") from None
        finally:
            conn.close()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        return response.status, body

    def describe(self, model: str, version: str | None = None) -> dict[str, Any]:
        path = f"/models/{model}" + (f"/{version}" if version else "")
        status, body = self._call("GET", path)
        if status != 200 or not isinstance(body, list) or not body:
            raise BenchError(f"GET {path} answered {status}: {body}")
        return body[0]

    def configure(self, model: str, version: str | None, settings: ModelSettings) -> None:
        """Apply ``settings`` live and wait until the workers are up (synchronous scale)."""
        query: dict[str, Any] = {"synchronous": "true"}
        if settings.batch_size is not None:
            query["batch_size"] = settings.batch_size
        if settings.max_batch_delay_ms is not None:
            query["max_batch_delay"] = settings.max_batch_delay_ms
        if settings.workers is not None:
            query["min_worker"] = settings.workers
            query["max_worker"] = settings.workers
        path = f"/models/{model}" + (f"/{version}" if version else "") + "?" + urlencode(query)
        status, body = self._call("PUT", path)
        if status != 200:
            raise BenchError(f"PUT {path} answered {status}: {body}")
        if settings.batch_size is not None or settings.max_batch_delay_ms is not None:
            self._check_applied(model, version, settings)

    def _check_applied(self, model: str, version: str | None, settings: ModelSettings) -> None:
        """Read the settings back: a server that ignored them would make the search a lie."""
        info = self.describe(model, version)
        if settings.batch_size is not None and info.get("batchSize") != settings.batch_size:
            raise BenchError(
                f"the server kept batchSize={info.get('batchSize')} after asking for "
                f"{settings.batch_size}: does its management API accept batch_size?"
            )
        delay = info.get("maxBatchDelay")
        want = settings.max_batch_delay_ms
        if want is not None and (delay is None or abs(float(delay) - want) > 1e-6):
            raise BenchError(f"the server kept maxBatchDelay={delay} after asking for {want}")


@dataclass
class ManagedServer(procstat.LoggedServer):
    """``torchbay serve`` for one archive, started in ``run_dir`` (log, ready file, keys)."""

    archive: Path
    run_dir: Path
    python: str = sys.executable
    start_timeout_s: float = 120.0
    auth: bool = True
    proc: subprocess.Popen | None = None
    endpoints: Endpoints | None = None
    _log: Any = field(default=None, repr=False)

    def command(self) -> list[str]:
        archive = self.archive.resolve()
        cmd = [
            *(self.python, "-m", "torchbay", "serve", "--model-store", str(archive.parent)),
            *("--models", archive.name, "--ready-file", str(self.ready_file)),
            *("--inference-address", "http://127.0.0.1:0"),
            *("--management-address", "http://127.0.0.1:0"),
            *("--metrics-address", "http://127.0.0.1:0"),
        ]
        if not self.auth:
            cmd.append("--disable-token-auth")
        return cmd

    @property
    def ready_file(self) -> Path:
        # Absolute: the server runs with run_dir as its cwd.
        return self.run_dir.resolve() / "ready.json"

    @property
    def log_path(self) -> Path:
        return self.run_dir / "server.log"

    def __enter__(self) -> Endpoints:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Endpoints:
        """Start the server and wait for its ready file; raises BenchError if it exits first,
        reports a failed model, or is not ready within ``start_timeout_s``."""
        if not self.archive.exists():
            raise BenchError(f"{self.archive}: no such archive")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.ready_file.unlink(missing_ok=True)
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            self.command(), cwd=self.run_dir, stdout=self._log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + self.start_timeout_s
        while not self.ready_file.exists():
            if self.proc.poll() is not None:
                self.stop()
                raise BenchError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise BenchError(f"server not ready in {self.start_timeout_s:.0f} s")
            time.sleep(0.02)  # the ready file is the readiness signal; this only polls for it
        ready = json.loads(self.ready_file.read_text())
        if ready.get("failed_models"):
            self.stop()
            raise BenchError(f"model failed to load: {ready['failed_models']}\n{self.log_tail()}")
        inference_key = management_key = None
        if self.auth:
            inference_key, management_key = read_key_file(self.run_dir / "key_file.json")
        self.endpoints = Endpoints(
            "127.0.0.1",
            ready["inference"],
            ready["management"],
            ready["metrics"],
            inference_key,
            management_key,
        )
        return self.endpoints
