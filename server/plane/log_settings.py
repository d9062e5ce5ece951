"""Triton's logging extension, once for every protocol: read and change the server's log settings
(REST ``GET``/``POST /v2/logging``, gRPC ``LogSettings``).

The settings are Triton's: ``log_info``, ``log_warning``, ``log_error`` (bool),
``log_verbose_level`` (0 and up), ``log_file`` and ``log_format``. They act on the server's own
loggers (``torchbay.*``) as a level: verbose above 0 is DEBUG, else INFO with ``log_info``, else
WARNING with ``log_warning``, else ERROR with ``log_error``, else nothing. Python's logging is
levelled, so a combination with a gap (``log_info`` on and ``log_warning`` off) is refused with a
400 that says so, where Triton would filter each severity on its own. The access log
(``torchbay.access``) keeps its own setting (``access_log``), and the log file and format are the
start-up configuration's: a request to change them is a 400 (Triton can reopen its log file
live). The worker processes keep the level they started with. A verbose level above 1 is
read back as it was set (Triton echoes it); logging has one DEBUG level, so every one acts as 1.
Torch-free.
"""

from __future__ import annotations

import logging
from typing import Any

from torchbay.server.errors import BadRequest

LOGGER = "torchbay"
FILE, FORMAT = "", "default"  # what Triton answers when it logs to the console in its format
_FLAGS = ("log_info", "log_warning", "log_error")
_LEVELS = {"log_info": logging.INFO, "log_warning": logging.WARNING, "log_error": logging.ERROR}
MAX_VERBOSE = (1 << 32) - 1  # Triton's uint32
_VERBOSE = "torchbay_verbose_level"  # the verbose level set, on the server's logger


def current() -> dict[str, Any]:
    """The settings as Triton answers them."""
    logger = logging.getLogger(LOGGER)
    level = logger.getEffectiveLevel()
    verbose = getattr(logger, _VERBOSE, 1) if level <= logging.DEBUG else 0
    return {
        "log_file": FILE,
        **{flag: level <= _LEVELS[flag] for flag in _FLAGS},
        "log_verbose_level": verbose,
        "log_format": FORMAT,
    }


def update(changes: Any) -> dict[str, Any]:
    """Apply ``changes`` (some of the settings; unknown keys and bad values are a 400 that names
    them, and nothing changes) and answer the settings now in force."""
    if not isinstance(changes, dict):
        raise BadRequest("the log settings must be a JSON object")
    settings = {**current(), **_checked(changes)}
    if settings["log_file"] != FILE:
        raise BadRequest("log_file cannot change while the server runs (set log files at start)")
    if settings["log_format"] != FORMAT:
        raise BadRequest(f"log_format: only {FORMAT!r} is served (set log_format at start)")
    level, logger = _level(settings), logging.getLogger(LOGGER)
    if level != logger.getEffectiveLevel():  # what is in force already is left as it is set
        logger.setLevel(level)
    _remember(logger, settings["log_verbose_level"])
    return current()


def level_set() -> int:
    """The level set on the server's loggers now (NOTSET: inherited), for ``restore``."""
    return logging.getLogger(LOGGER).level


def restore(level: int) -> None:
    """Put back the level ``level_set`` returned: a server that stops leaves the process's
    logging as it found it (a test process runs many servers one after another)."""
    logger = logging.getLogger(LOGGER)
    logger.setLevel(level)
    _remember(logger, 0)


def _remember(logger: logging.Logger, verbose: int) -> None:
    """Keep the verbose level set (above 0) for ``current``; 0 forgets it."""
    if verbose > 0:
        setattr(logger, _VERBOSE, verbose)
    elif hasattr(logger, _VERBOSE):
        delattr(logger, _VERBOSE)


def _checked(changes: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(changes) - {*_FLAGS, "log_verbose_level", "log_file", "log_format"})
    if unknown:
        raise BadRequest(f"unknown log setting(s) {unknown}")
    for flag in _FLAGS:
        if flag in changes and not isinstance(changes[flag], bool):
            raise BadRequest(f"{flag} must be true or false")
    verbose = changes.get("log_verbose_level", 0)
    if type(verbose) is not int or not 0 <= verbose <= MAX_VERBOSE:
        raise BadRequest(f"log_verbose_level must be a whole number from 0 to {MAX_VERBOSE}")
    for key in ("log_file", "log_format"):
        if key in changes and not isinstance(changes[key], str):
            raise BadRequest(f"{key} must be a string")
    return changes


def _level(settings: dict[str, Any]) -> int:
    """The one level the settings name; BadRequest for a combination with a gap."""
    if settings["log_verbose_level"] > 0:
        level = logging.DEBUG
    else:
        on = [flag for flag in _FLAGS if settings[flag]]
        level = _LEVELS[on[0]] if on else logging.CRITICAL + 10
    for flag in _FLAGS:
        if _LEVELS[flag] >= level and not settings[flag]:
            raise BadRequest(
                f"{flag} cannot be off while a lower severity is on: torchbay logs by level "
                "(verbose > info > warning > error)"
            )
    return level
