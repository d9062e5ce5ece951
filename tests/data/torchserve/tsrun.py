"""What every TorchServe recorder (``tests/data/torchserve*/**/record.py``) does the same way:
build archives with TorchServe's own archiver, start TorchServe 0.12 in the foreground in a folder
of its own, call it, stop it, and say which TorchServe answered.

Standard library only: the recorders run in TorchServe's virtualenv (/work/ts-venv), where
torchbay is not installed, so each one puts this folder on ``sys.path`` and imports this module by
name. TorchServe's launcher and its java server share a process group (``start_new_session``), so
stopping the group stops both; its pid file lives in ``TMPDIR``, given a folder per run so that
another TorchServe on this host does not stop this one's start.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

LISTENERS = ("inference", "management", "metrics")
_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
START_FLAGS = ("--start", "--foreground", "--ncs", "--disable-token-auth", "--enable-model-api")


def recorder_command(script: str) -> str:
    """The command line that runs a recorder (``script``, its ``__file__``) from the repository
    root, TorchServe's virtualenv first on PATH: what each answers.json says made it."""
    root = Path(__file__).resolve().parents[3]
    relative = Path(script).resolve().relative_to(root)
    return f"PATH=/work/ts-venv/bin:$PATH /work/ts-venv/bin/python {relative}"


def scripted_linear(work: Path) -> Path:
    """A seeded TorchScript ``Linear(4, 2)`` saved as ``work/model.pt`` (the handlers under test
    make its output their own; it only has to load). torch is imported here, not at the top: the
    helper's other callers may run without it."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    torch.jit.save(torch.jit.script(model.eval()), str(work / "model.pt"))
    return work / "model.pt"


def tool(name: str) -> str:
    """TorchServe's command ``name`` beside the running interpreter when it is there (a
    recorder run as /work/ts-venv/bin/python), else the name, found on PATH."""
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.exists() else name


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick for port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    """Whether a server accepts connections on the port (a connection, no request: TorchServe
    would count a request in its metrics)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except OSError:
        return False
    return True


def call(
    url: str,
    method: str,
    body: bytes | None = None,
    content_type: str = "text/plain",
    headers: dict[str, str] | None = None,
) -> tuple[int, str, bytes]:
    """(status, content type, body) of one request (with ``headers``); an error status is an
    answer, not an exception. A connection that fails raises OSError (the server is not up)."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    if body is not None:
        request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.headers.get("content-type", ""), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("content-type", ""), exc.read()


def archive(
    name: str,
    handler: Path,
    export: Path,
    *extra: str,
    version: str = "1.0",
    archiver: str | None = None,
) -> Path:
    """``torch-model-archiver`` (``archiver``, else :func:`tool`'s) for one model (``extra``:
    its other flags, such as ``--serialized-file``); returns the ``.mar`` it wrote."""
    command = [archiver or tool("torch-model-archiver"), "--model-name", name, "--version", version]
    command += ["--handler", str(handler), "--export-path", str(export), *extra]
    subprocess.run(command, check=True)
    return export / f"{name}.mar"


def build_store(
    work: Path,
    archives: dict[str, tuple[str, str, str]],
    handlers: Path,
    archiver: str | None = None,
) -> Path:
    """``work/store`` with ``archives`` (file name -> model name, version, handler file in
    ``handlers``), each packed by torch-model-archiver over one tiny scripted model."""
    store = work / "store"
    store.mkdir()
    model = scripted_linear(work)
    for file_name, (name, version, handler) in archives.items():
        out = work / f"build-{file_name}"
        out.mkdir()
        serialized = ("--serialized-file", str(model))
        mar = archive(
            name, handlers / handler, out, *serialized, version=version, archiver=archiver
        )
        os.replace(mar, store / file_name)
    return store


def properties(path: Path, config: dict[str, str]) -> Path:
    """Write ``config`` as a config.properties file."""
    path.write_text("".join(f"{key}={value}\n" for key, value in config.items()))
    return path


def command(store: Path, config: Path, *extra: str) -> list[str]:
    """The recorders' TorchServe command line: the foreground, no config snapshots, no token,
    the model API on, ``store`` as the model store."""
    return [
        tool("torchserve"),
        *START_FLAGS,
        "--model-store",
        str(store),
        *extra,
        "--ts-config",
        str(config),
    ]


def wait_for(
    ready: Callable[[], bool], proc: subprocess.Popen, log: Path, timeout_s: float
) -> None:
    """Poll ``ready`` until it holds; exit with the log's path if TorchServe exits or the time
    runs out first. A ``ready`` that raises OSError counts as not ready (no listener yet)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError):
            if ready():
                return
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit(f"TorchServe did not get ready; see {log}")
        time.sleep(0.5)


@contextlib.contextmanager
def running(
    argv: Sequence[str],
    work: Path,
    ready: Callable[[], bool],
    *,
    env: dict[str, str] | None = None,
    ports: Sequence[int] = (),
    timeout_s: float = 120.0,
) -> Iterator[subprocess.Popen]:
    """TorchServe started with ``argv`` in ``work`` (its output in ``work/ts.out``), ready by
    ``ready``; on leaving, its process group is stopped and, with ``ports``, the wait lasts until
    none of them listens (the java server's last moments), so the next run can take them."""
    tmp = work / "tmp"
    tmp.mkdir(exist_ok=True)
    environ = {**os.environ, "TMPDIR": str(tmp), **(env or {})}
    log_path = work / "ts.out"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            list(argv),
            cwd=work,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environ,
            start_new_session=True,
        )
        try:
            wait_for(ready, proc, log_path, timeout_s)
            yield proc
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
            while any(listening(port) for port in ports):
                time.sleep(0.5)


@contextlib.contextmanager
def served(
    prefix: str, archives: dict[str, tuple[str, str, str]], handlers: Path, **config: str
) -> Iterator[tuple[Path, dict[str, str]]]:
    """TorchServe over :func:`build_store`'s store of ``archives`` in a new folder (``prefix``,
    kept: its ts.out), each listener on a free port and ``config`` beside them in its
    config.properties, ready once it answers ``/ping``: (the folder, {listener: base URL})."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    store = build_store(work, archives, handlers)
    bases = {name: f"http://127.0.0.1:{free_port()}" for name in LISTENERS}
    settings = {f"{name}_address": base for name, base in bases.items()}
    settings.update(config)
    argv = command(store, properties(work / "config.properties", settings))
    with running(argv, work, pinged(bases["inference"])):
        yield work, bases


@contextlib.contextmanager
def archived(name: str, handler: Path) -> Iterator[tuple[Path, Path]]:
    """A temporary folder, removed on leaving, and its ``store``: ``name``.mar, ``handler``'s
    model (no serialized file) packed by :func:`archive`."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store = work / "store"
        store.mkdir()
        archive(name, handler, store)
        yield work, store


def pinged(base: str) -> Callable[[], bool]:
    """A ``ready`` test: the inference listener answers ``/ping`` (any status)."""
    return lambda: bool(call(base + "/ping", "GET"))


def torchserve_version(python: str = sys.executable) -> str:
    """``python`` 's torchserve's version, from pip (``?`` when pip does not say)."""
    shown = subprocess.run(
        [python, "-m", "pip", "show", "torchserve"], capture_output=True, text=True
    ).stdout
    versions = (line.split()[-1] for line in shown.splitlines() if line.startswith("Version:"))
    return next(versions, "?")


def prometheus_text(
    text: str, counted: Collection[str], label: Callable[[str, str], str]
) -> tuple[dict[str, str], list[list[Any]]]:
    """A /metrics body as the records keep it: its families' types ({family: type}, from the
    TYPE lines) and its samples ([name, [[label, value], ...], value]), less what differs from
    run to run: each label's value goes through ``label(name, value)``, and a sample's value is
    "<value>" unless its name is in ``counted`` (counts, kept as numbers)."""
    types: dict[str, str] = {}
    samples: list[list[Any]] = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(maxsplit=3)
            types[family] = kind
            continue
        match = _SAMPLE.match(line)
        if not match or line.startswith("#"):
            continue
        labels = [[k, label(k, v)] for k, v in _LABEL.findall(match["labels"] or "")]
        value: Any = float(match["value"]) if match["name"] in counted else "<value>"
        samples.append([match["name"], labels, value])
    return types, samples


def json_call(method: str, url: str, body: bytes | None) -> tuple[int, Any]:
    """A scenario's ``call`` (its body, when there is one, sent as JSON): (status, the answer's
    JSON, or its text when it is not JSON)."""
    status, _, raw = call(url, method, body, "application/json")
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def json_or_text(response: Any) -> Any:
    """An answer's body as a record keeps it: its JSON, or its text when it is not JSON (an
    httpx response, from the recorders that run in torchbay's virtualenv)."""
    try:
        return response.json()
    except ValueError:
        return response.text


def write_json(path: Path, record: dict) -> None:
    """Write a record the way every answers.json is written (indent 1, a final newline)."""
    path.write_text(json.dumps(record, indent=1) + "\n")


def write_record(folder: Path, command: str, **answers: Any) -> None:
    """``folder/answers.json``: the recorder's command, TorchServe's version and ``answers``."""
    record = {"command": command, "torchserve": torchserve_version(), **answers}
    write_json(folder / "answers.json", record)
    print(f"wrote {folder / 'answers.json'}")


def write_answers(folder: Path, command: str, answers: Any, work: Path, **where: str) -> None:
    """``folder/answers.json``: the recorder's command, TorchServe's and Java's versions (``where``:
    ``python``, another interpreter's torchserve) and the answers; says where TorchServe's own
    output is (``work/ts.out``)."""
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    record = {
        "command": command,
        "torchserve": torchserve_version(**where),
        "java": java.splitlines()[0],
        "answers": answers,
    }
    write_json(folder / "answers.json", record)
    print(f"wrote {folder / 'answers.json'}; TorchServe's own output: {work / 'ts.out'}")
