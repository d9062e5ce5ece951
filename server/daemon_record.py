"""What ``--start``'s server records beside its pid file (``.model_server.pid.json``): its pid,
its start and its ``shutdown_grace_s``.

``--stop`` waits as long as the server's own stop bound for that grace (``daemon.stop_wait``).
The start (clock ticks since boot, Linux's ``/proc/<pid>/stat``: immune to the wall clock's
steps) tells the server from a later process given the same pid: a server killed without
removing its pid file (SIGKILL, the OOM killer) whose pid went to another torchbay server, one
of another ``TMPDIR``, is not that server. ``--start`` writes the record with the pid file; the
server writes it again with its grace once its configuration is read.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any


def record_path(pid_file: Path) -> Path:
    return pid_file.with_name(f"{pid_file.name}.json")


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot; None when it is gone (or not Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rpartition(")")[2].split()[19])  # field 22; the name may hold spaces
    except (OSError, ValueError, IndexError):
        return None


def write(pid_file: Path, pid: int, **fields: Any) -> None:
    """The record of the server ``pid``, replacing any (a failed write: --stop's defaults)."""
    path = record_path(pid_file)
    tmp = path.with_name(f"{path.name}.{pid}.tmp")
    try:
        tmp.write_text(json.dumps({"pid": pid, "started": start_ticks(pid), **fields}))
        tmp.replace(path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


def read(pid_file: Path, pid: int) -> dict[str, Any]:
    """The record of ``pid``; empty when there is none or it is another pid's."""
    try:
        record = json.loads(record_path(pid_file).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) and record.get("pid") == pid else {}


def reused(pid_file: Path, pid: int) -> bool:
    """``pid`` runs, but is not the process the record was written for."""
    started = read(pid_file, pid).get("started")
    now = start_ticks(pid)
    return started is not None and now is not None and now != started


def remove(pid_file: Path, pid: int) -> None:
    if read(pid_file, pid):
        with contextlib.suppress(OSError):
            record_path(pid_file).unlink()
