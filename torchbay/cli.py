"""The ``torchbay`` command: a thin dispatcher over one function per verb.

Each part registers its verbs (``register(subparsers)``) and owns the core functions they call, so
tests call those functions directly. Domain errors print one line and exit 1; configuration errors
(a bad value: one line per field; an unreadable config file) exit 2; a traceback only with
``--debug`` or ``TORCHBAY_DEBUG=1``. Ctrl-C that no verb handles (one pressed while the command
starts) exits 130, without a traceback; a SIGTERM while ``serve`` starts is a clean stop, exit 0
(server/early_stop.py).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from torchbay import __version__

# Modules that register verbs. Each must be importable without torch.
_VERB_MODULES = (
    "torchbay.archiver.cli",
    "torchbay.server.cli",
    "torchbay.server.admin.client",
    "torchbay.benchmarks.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchbay",
        description="Serve PyTorch models: archive, serve, manage, observe and benchmark.",
    )
    parser.add_argument("--version", action="version", version=f"torchbay {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB")
    for name in _VERB_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a part not built yet
            if exc.name != name:
                raise
            continue
        module.register(subparsers)
    return parser


def _domain_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = []
    for module_name, attr in (
        ("torchbay.server.errors", "TorchbayError"),
        ("torchbay.archiver.errors", "ArchiveError"),
        ("torchbay.handlers.errors", "HandlerError"),
        ("torchbay.benchmarks.errors", "BenchError"),
    ):
        try:
            errors.append(getattr(importlib.import_module(module_name), attr))
        except (ModuleNotFoundError, AttributeError):
            continue
    return tuple(errors)


def _print_validation_error(exc: BaseException) -> None:
    """One line per bad field: ``torchbay: invalid configuration: max_batch_delay_ms: ...``."""
    for err in exc.errors():  # type: ignore[attr-defined]
        where = ".".join(str(part) for part in err.get("loc", ())) or "(root)"
        message = str(err.get("msg", "invalid")).replace("\n", " ")
        value = err.get("input")
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            shown = repr(value)
            if len(shown) <= 60 and repr(value) not in message:
                message += f" (got {shown})"
        print(f"torchbay: invalid configuration: {where}: {message}", file=sys.stderr)


def _debug(args: argparse.Namespace) -> bool:
    return bool(args.debug) or os.environ.get("TORCHBAY_DEBUG", "") not in ("", "0")


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    early = None
    # First thing: a SIGTERM while the server starts is a clean stop (server/early_stop.py).
    from torchbay.server.early_stop import Terminated, runs_server, take_sigterm

    if runs_server(words):
        take_sigterm()
    try:
        # `serve` with start-up models: the worker template first, so that its torch import (the
        # slowest step of a start) overlaps everything below instead of following it.
        from torchbay.server.early_workers import spawn_early
        from torchbay.server.serving.worker_env import tag_worker_logs

        # Every worker spawned from here on starts its log lines with this secret: the server's
        # WorkerOutput tells them from what a handler prints (serving/worker_env.LOG_TAG).
        tag_worker_logs(os.environ)
        early = spawn_early(words)
        return _main(words, early)
    except KeyboardInterrupt:  # Ctrl-C before a verb took it (the imports): no traceback
        return 130
    except Terminated:  # SIGTERM before the server's loop took it: a stop, what started undone
        return 0
    finally:
        if early is not None:
            early.close()  # those the server did not adopt (a bad flag, a config error, ...)


def _main(words: list[str], early: object) -> int:
    parser = build_parser()
    args = parser.parse_args(words)
    args.argv = words  # `serve --start` runs it again
    args.early_workers = early
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    debug = _debug(args)
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not debug:  # `torchbay models ...` prints its result, not one line per HTTP call
        logging.getLogger("httpx").setLevel(logging.WARNING)
    from pydantic import ValidationError

    from torchbay.server.errors import ConfigError

    try:
        result = args.func(args)
    except ValidationError as exc:
        if debug:
            raise
        _print_validation_error(exc)
        return 2
    except ConfigError as exc:
        if debug:
            raise
        print(f"torchbay: invalid configuration: {exc}", file=sys.stderr)
        return 2
    except _domain_errors() as exc:
        if debug:
            raise
        print(f"torchbay: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
