"""TorchServe's config snapshots: files, names, and which one a start restores. Torch-free.

TorchServe writes the server's configuration and its models' state (``model_snapshot``) to
``$LOG_LOCATION/config/<yyyyMMddHHmmssSSS>-<kind>.cfg`` (``logs/config`` by default): ``startup``
once the start-up models are in, ``snapshot`` after every management change, ``shutdown`` when it
stops. A start with no ``--ts-config`` (and no ``TS_CONFIG_FILE``) reads the newest snapshot
instead of ``config.properties``, and a configuration that holds a ``model_snapshot`` loads its
models and ignores ``load_models`` and ``--models``. ``--ncs`` (``--no-config-snapshots``)
turns both off.

A snapshot is a ``config.properties`` in Java's format: the settings the server was started with
(file, environment and flags, as declared, under the names they were declared with; absolute
paths) and ``model_snapshot``. It never holds a secret: settings that carry one (a keystore
password, anything named like a password, secret or token value) are left out, so a snapshot can
be read by whoever reads the logs folder. It is written to a temporary name and renamed, mode 0600,
and never overwrites a snapshot of the same name.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

# <yyyyMMddHHmmssSSS>-<kind>.cfg: the only names a restore considers (TorchServe's format).
_NAME = re.compile(r"^(\d{17})-[A-Za-z0-9_]+\.cfg$")
KINDS = ("startup", "snapshot", "shutdown")
# Never in a snapshot: what would hand a reader of the logs folder a secret, and what the
# snapshot itself replaces (``models``, ``model_snapshot``: its own models' state), or where
# snapshots go (a restore must not move them).
_SECRET = re.compile(r"pass|secret|credential|(^|_)token$", re.IGNORECASE)
_REPLACED = frozenset({"model_snapshot", "models", "snapshot_dir", "tsConfigFile"})


def snapshot_dir(log_dir: Path) -> Path:
    """Where snapshots go: ``<log dir>/config`` (TorchServe's ``$LOG_LOCATION/config``)."""
    return log_dir / "config"


def snapshot_name(kind: str, now: datetime | None = None) -> str:
    """``20261126140605123-startup.cfg``: local time to the millisecond, as TorchServe names it."""
    now = now or datetime.now()
    return f"{now.strftime('%Y%m%d%H%M%S')}{now.microsecond // 1000:03d}-{kind}.cfg"


def last_snapshot(directory: Path) -> Path | None:
    """The newest snapshot in ``directory`` by the time in its name; None when there is none.
    Files named otherwise are not snapshots (TorchServe fails on them; we pass them over), nor
    is an empty file (what a crash can leave of a write: read, it would start the server with
    no model and no setting, config.properties passed over too)."""
    try:
        names = [p.name for p in directory.iterdir() if _NAME.match(p.name) and _filled(p)]
    except OSError:
        return None
    if not names:
        return None
    return directory / max(names, key=lambda name: (name[:17], name))


def _filled(path: Path) -> bool:
    try:
        return path.is_file() and path.stat().st_size > 0
    except OSError:
        return False


def declared_properties(raw: Mapping[str, Any]) -> dict[str, str]:
    """The settings as declared, each a property string, less secrets and what a snapshot
    replaces; ``None`` values (flags not given) are not declared."""
    out: dict[str, str] = {}
    for key, value in raw.items():
        if value is None or key in _REPLACED or _SECRET.search(key):
            continue
        out[key] = _property_value(value)
    return out


def _property_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        if all(isinstance(v, str) for v in value):
            return ",".join(value)
        return ",".join(str(v) for v in value)
    if isinstance(value, Mapping):
        return json.dumps(value, separators=(",", ":"), default=str)
    return str(value)


def format_properties(props: Mapping[str, str], comment: str = "Saving snapshot") -> str:
    """Java ``Properties.store``'s format: ``key=value`` lines, ``\\``, ``:``, ``=``, ``#``, ``!``
    and leading spaces escaped, line breaks as ``\\n`` (our reader, config.properties, reads it)."""
    lines = [f"#{comment}", f"#{datetime.now().strftime('%a %b %d %H:%M:%S %Y')}"]
    lines += [f"{_escape(k, key=True)}={_escape(v)}" for k, v in props.items()]
    return "\n".join(lines) + "\n"


def _escape(text: str, key: bool = False) -> str:
    out = []
    for i, ch in enumerate(text):
        if ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ch in ":=#!" or (ch == " " and (key or i == 0)):
            out.append("\\" + ch)
        elif "\ud800" <= ch <= "\udfff":  # a byte not UTF-8 (os.environ, argv): read back as is
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def write_snapshot(directory: Path, name: str, text: str) -> Path | None:
    """Write one snapshot file; None (nothing written) when one of that name exists already."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    if path.exists():
        return None
    tmp = directory / f".{name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())  # renamed only once on disk: never an empty snapshot
        os.replace(tmp, path)
    except BaseException:  # a full disk, text that is not UTF-8: no half-written file is left
        tmp.unlink(missing_ok=True)
        raise
    return path
