"""``torchbay serve``: TorchServe's command-line flags, so scripts change only the binary name."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from torchbay import __version__

log = logging.getLogger("torchbay.cli")
# The stores and what of each loads at start: (noun, what a store holds, the verb, archive
# suffix, TorchServe's config key), for --<noun>-store and --<noun>s.
_STORES = (
    ("model", ".mar archives", "load", ".mar", "TorchServe's load_models"),
    ("workflow", ".war workflow archives", "register", ".war", "load_workflows"),
)


def register(subparsers: Any) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="serve model archives (foreground; --start: in the background)",
        description="Serve model archives: inference (8080), management (8081), metrics (8082). "
        "Logs go to the console and to logs/ (LOG_LOCATION): ts_log.log, access_log.log, "
        "model_log.log.",
    )
    _lifecycle_flags(serve)
    for noun, holds, verb, ext, key in _STORES:
        serve.add_argument(f"--{noun}-store", help=f"folder holding the {holds}")
        spec = f"{noun}s to {verb} at start: all | x{ext} | name=x{ext} ({key})"
        serve.add_argument(f"--{noun}s", nargs="+", metavar="SPEC", help=spec)
    serve.add_argument("--ts-config", help="a TorchServe config.properties")
    serve.add_argument("--inference-address", help="default http://127.0.0.1:8080")
    serve.add_argument("--management-address", help="default http://127.0.0.1:8081")
    serve.add_argument("--metrics-address", help="default http://127.0.0.1:8082")
    _switches(serve)
    serve.add_argument("--number-of-gpu", type=int, help="GPUs to use (default: all visible)")
    serve.add_argument(
        "--cpu-thread-budget",
        type=int,
        help="torch threads shared by all CPU workers of all models (cpu_thread_budget; default: "
        "the usable cores); see docs/threads.md",
    )
    serve.add_argument("--log-format", choices=("text", "json"))
    serve.add_argument(
        "--ready-file", help="write the bound ports as JSON here once every startup model loaded"
    )
    serve.add_argument(
        "--ncs",
        "--no-config-snapshots",
        dest="no_config_snapshots",
        action="store_true",
        help="neither restore the last config snapshot (logs/config) nor write new ones",
    )
    # The server --start runs: where it says "ready" (server/daemon.py).
    serve.add_argument("--daemon-fd", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--ts-class", help=argparse.SUPPRESS)  # daemon.TORCHSERVE_CLASS, see there
    # TorchServe's flags for its Java plugins and C++ backend: taken, noted and ignored.
    serve.add_argument("--plugins-path", "--ppath", help=argparse.SUPPRESS)
    serve.add_argument("--cpp-log-config", help=argparse.SUPPRESS)
    serve.set_defaults(func=run_serve)


def _switches(serve: argparse.ArgumentParser) -> None:
    """The on/off flags (None when not given: config.properties decides)."""
    serve.add_argument(
        "--disable-token-auth",
        "--dt",  # TorchServe's short form
        action="store_true",
        default=None,
        help="serve without API keys",
    )
    serve.add_argument(
        "--enable-model-api",
        action="store_true",
        default=None,
        help="allow registering and unregistering models through the management API",
    )
    serve.add_argument(  # Triton's --allow-client-shm=<bool>, or bare as a switch
        "--allow-client-shm",
        nargs="?",
        const=True,
        default=None,
        type=_boolean,
        metavar="BOOL",
        help="let clients register shared-memory regions for inputs and outputs (Triton's "
        "--allow-client-shm=true; allow_client_shm)",
    )
    serve.add_argument(
        "--no-access-log",
        dest="access_log",
        action="store_false",
        default=None,
        help="no access-log line per inference request",
    )


def _boolean(text: str) -> bool:
    """A flag's boolean value, as Triton's command line reads one (true/on/1, false/off/0)."""
    value = text.strip().lower()
    if value in ("true", "on", "1"):
        return True
    if value in ("false", "off", "0"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean (true or false)")


def _lifecycle_flags(serve: argparse.ArgumentParser) -> None:
    """TorchServe's --start/--stop/--foreground/--log-config (see server/daemon.py)."""
    mode = serve.add_mutually_exclusive_group()
    mode.add_argument(
        "--start",
        action="store_true",
        help="start in the background: return once it serves (pid file $TMPDIR/.model_server.pid)",
    )
    mode.add_argument("--stop", action="store_true", help="stop the server --start started")
    mode.add_argument(  # TorchServe's `torchserve -v`, which scripts run as `torchbay serve -v`
        "-v", "--version", action="version", version=f"torchbay {__version__}"
    )
    serve.add_argument(
        "--foreground", action="store_true", help="run in this process (the default; beats --start)"
    )
    serve.add_argument(
        "--log-config",
        help="Python logging config: dictConfig JSON/YAML or fileConfig INI (log4j2 XML: ignored)",
    )


def _cli_settings(args: argparse.Namespace) -> dict[str, Any]:
    settings = {
        "model_store": args.model_store,
        "load_models": args.models,
        "workflow_store": args.workflow_store,
        "load_workflows": args.workflows,
        "inference_address": args.inference_address,
        "management_address": args.management_address,
        "metrics_address": args.metrics_address,
        "disable_token_authorization": args.disable_token_auth,
        "enable_model_api": args.enable_model_api,
        "allow_client_shm": args.allow_client_shm,
        "number_of_gpu": args.number_of_gpu,
        "cpu_thread_budget": args.cpu_thread_budget,
        "log_format": args.log_format,
        "access_log": args.access_log,
    }
    return {k: v for k, v in settings.items() if v is not None}


def expected_startup_workers(config: Any) -> int:
    """A cheap guess at how many workers the startup models need (archives not yet read)."""
    named = {spec.name or spec.url for spec in config.model_specs()}
    count = len(named) * config.default_workers_per_model
    for name, versions in config.models.items():
        if name not in named:
            count += sum(max(v.min_workers, 0) for v in versions.values() if v.mar_name)
    if config.load_all and config.model_store is not None and config.model_store.is_dir():
        count += sum(1 for p in config.model_store.iterdir() if p.suffix == ".mar")
    return min(count, 2 * (os.cpu_count() or 1))


def run_serve(args: argparse.Namespace) -> int:
    from torchbay.server import daemon

    if args.stop:
        return daemon.stop()
    if args.start and not args.foreground and args.daemon_fd is None:
        return daemon.start(getattr(args, "argv", None) or sys.argv[1:])
    return _serve(args)


def _load_config(args: argparse.Namespace) -> tuple[Any, list[str]]:
    """The server's configuration from every source; unless ``--ncs``, the newest config
    snapshot stands in for config.properties and new ones are written (config/snapshots.py)."""
    from torchbay.server.config.snapshots import snapshot_dir
    from torchbay.server.config.sources import load_server_config
    from torchbay.server.observe.logfiles import log_dir

    snapshots = None if args.no_config_snapshots else snapshot_dir(log_dir(os.environ)).absolute()
    cli = {**_cli_settings(args), "snapshot_dir": snapshots}
    return load_server_config(
        ts_config=args.ts_config, env=dict(os.environ), cli=cli, snapshots=snapshots
    )


def _prewarmed(args: argparse.Namespace, config: Any) -> tuple[list[Any], Any]:
    """The start-up models' worker processes, started now, and the worker template the CLI
    started before its imports (spawn_early), for the server to adopt. A template
    (``worker_start: fork``) is all there is: every start-up worker forks from it, one import of
    torch for them all, begun before the frontend's. Otherwise each worker imports torch (the
    slowest part of start-up) while the frontend imports the rest and unpacks the archives;
    the CLI's early worker counts towards them. They inherit stdout and stderr: the pipe that
    WorkerOutput reads into model_log.log. Nothing early is used when ``blacklist_env_vars``
    hides variables: it was started with every one."""
    from torchbay.server.serving import forkserver
    from torchbay.server.serving.handle import spawn_process
    from torchbay.server.serving.worker_env import visible_env

    early, forking = getattr(args, "early_workers", None), forkserver.forks(config)
    if early is not None and config.blacklist_env_vars:
        early.close()
        early = None
    prewarmed, template = early.adopt(config.log_format, forking) if early else ([], None)
    if forking:
        return prewarmed, template
    env = visible_env(os.environ, config.blacklist_env_vars)
    return prewarmed + [
        spawn_process(env, log_format=config.log_format)
        for _ in range(expected_startup_workers(config) - len(prewarmed))
    ], None


def _serve(args: argparse.Namespace) -> int:
    """The server in this process: ``--foreground``, or the child ``--start`` runs."""
    from torchbay.server import daemon
    from torchbay.server.errors import TorchbayError
    from torchbay.server.http.listeners import bind_listeners, close_all, preflight
    from torchbay.server.observe.logfiles import read_log_config

    for flag, given in (
        ("--plugins-path", args.plugins_path),
        ("--cpp-log-config", args.cpp_log_config),
    ):
        if given:
            log.info("%s is a TorchServe option torchbay ignores", flag)
    log_config = read_log_config(args.log_config) if args.log_config else None
    config, notes = _load_config(args)
    # Everything that can make the start fail on its own (a missing store, unreadable TLS files,
    # a port in use) is checked before a worker is spawned, a log line written or the key file
    # touched: the error is one line, and a server already on that port is left alone.
    if config.model_store is None:  # as TorchServe's launcher: nothing to serve from
        raise TorchbayError(
            "missing mandatory parameter --model-store (or model_store in --ts-config)"
        )
    preflight(config)
    ready_file = _ready_file(args.ready_file)
    listeners = bind_listeners(config)
    notice = _ready_notice(args.daemon_fd, config.shutdown_grace_s)
    output = stop_logging = None
    early = getattr(args, "early_workers", None)
    try:
        output, stop_logging = _start_logging(config, log_config, notes, notice is not None)
        prewarmed, template = _prewarmed(args, config)
        try:
            server = _server_class(lambda: _on_ready(notice, output, stop_logging))(
                config,
                env=dict(os.environ),
                ready_file=ready_file,
                prewarmed=prewarmed,
                template=template,
                listeners=listeners,
            )
        except BaseException:  # a SIGTERM in the server's imports (early_stop.Terminated), ...
            _discard(prewarmed, template)
            raise
        _run(server)
    finally:
        close_all(listeners)  # the server took them; only a failure before that leaves any
        if early is not None:  # its output reaches fd 1 through a thread: the last lines first
            early.join_output()
        if output is not None:  # the workers' last lines, then the log writer's, then closed
            output.close(then=stop_logging)
        elif stop_logging is not None:
            stop_logging()
        if notice is not None:
            notice.close()
            daemon.remove_pid_file(os.getpid())
    return 0


def _discard(prewarmed: list[Any], template: Any = None) -> None:
    """Workers (and the early template) started for a server that never took them: idle,
    killed now (one still importing torch would read the EOF of its socket only once the
    import is done)."""
    for spawned in prewarmed:
        spawned.proc.kill()
        spawned.discard()
    if template is not None:
        proc, ctl, _ = template
        proc.kill()
        proc.wait()
        ctl.close()


def _ready_file(value: str | None) -> Path | None:
    """``--ready-file``, refused now (one line) when its folder cannot hold it: not after every
    startup model loaded."""
    from torchbay.server.errors import TorchbayError

    if not value:
        return None
    path = Path(value)
    folder = path.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise TorchbayError(f"cannot write --ready-file {path}: folder {folder} {what}")
    if path.is_dir():
        raise TorchbayError(f"cannot write --ready-file {path}: it is a folder")
    return path


def _start_logging(
    config: Any, log_config: Any, notes: list[str], detached: bool = False
) -> tuple[Any, Any]:
    """Console and log files (``logs/`` or ``LOG_LOCATION``), workers' output, --log-config.
    ``detached``: started by ``--start``, whose console ends once the server is up."""
    from torchbay.server.observe.logfiles import WorkerOutput, log_dir, log_files
    from torchbay.server.observe.logs import configure_logging
    from torchbay.server.observe.rollover import Rotation
    from torchbay.server.serving.worker_env import LOG_TAG

    files, unwritable = log_files(log_dir(os.environ))
    output = WorkerOutput(tag=os.environ.get(LOG_TAG, ""))  # torchbay.cli.main's
    try:
        # --log-format json: one object a line, from the frontend and its workers alike.
        stop_logging = configure_logging(
            config.log_format,
            access_log=config.access_log,
            stream=output.console,
            files=files,
            rotation=Rotation.of(config),
        )
    except BaseException:
        output.close()
        raise
    output.start(stop_logging)
    if unwritable:
        log.warning("%s%s", unwritable, _NOWHERE if detached else "")
    for note in notes:  # lenient.validate's notes are warnings: a value of the file was dropped
        if note.startswith("WARNING "):
            log.warning("%s", note.removeprefix("WARNING "))
        else:
            log.info("%s", note)
    if log_config is not None:
        try:
            log_config.apply()
        except BaseException:
            stop_logging()  # first: the writer thread drains what it holds into the console
            output.close()
            raise
    return output, stop_logging


# What an unwritable log folder means to a server started by --start: no console once it is up.
_NOWHERE = (
    "; --start's console ends once the server is up, so from then on it logs nowhere "
    "(make the folder writable, set LOG_LOCATION, or run it with --foreground)"
)


def _ready_notice(fd: int | None, grace_s: float) -> Any:
    """The server ``--start`` runs: its "ready" pipe; its grace recorded for ``--stop``."""
    if fd is None:
        return None
    from torchbay.server.daemon import ReadyNotice, record_grace

    record_grace(os.getpid(), grace_s)
    return ReadyNotice(fd)


def _on_ready(notice: Any, output: Any, pipeline: Any) -> None:
    """Started by ``--start``: the console so far went to ``--start``; from now on, only files."""
    if notice is None:
        return
    from torchbay.server.observe.logfiles import SERVER_LOG, log_dir

    pipeline.flush()
    server_log = log_dir(os.environ) / SERVER_LOG
    output.detach_console(server_log if server_log.is_file() else None)
    notice.send()


def _server_class(on_ready: Any) -> Any:
    from torchbay.server.serve import TorchbayServer

    class Server(TorchbayServer):
        async def startup(self) -> None:
            await super().startup()
            on_ready()

    return Server


def _run(server: Any) -> None:
    import asyncio

    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
        asyncio.run(server.serve())
    else:
        uvloop.run(server.serve())
