"""The environment a worker process starts with: the server's own, plus two glibc malloc settings
that keep a CPU model's activations in the heap between batches.

By default glibc serves a large allocation with a fresh ``mmap`` and gives it back with ``munmap``
when freed (its threshold starts at 128 KiB and rises only as far as what was last freed), and
trims the heap's free top after each large free. A forward pass allocates and frees megabytes of
activations, so every batch page-faults them in again (zero-filled by the kernel). Fixing the
thresholds (``MALLOC_MMAP_THRESHOLD_`` 32 MiB, glibc's maximum; ``MALLOC_TRIM_THRESHOLD_``
256 MiB) reuses that memory instead: on this project's 2-core machine the reference cnn at batch
8 ran 320 samples/s per intra-op thread instead of 206, and ``cnn, c=16, batch 8, 2 workers``
served 500 req/s instead of 390 (benchmarks/RESULTS.md, "The allocator"). The cost: a worker keeps
up to its peak working set (plus 256 MiB of free heap) instead of returning it to the host.

It is what the PyTorch performance tuning guide's "use a better allocator" (jemalloc, tcmalloc)
buys, from glibc alone. Left alone when the environment already chooses: ``LD_PRELOAD`` of
jemalloc, tcmalloc or mimalloc, ``GLIBC_TUNABLES`` with ``glibc.malloc`` settings, either variable
set, or ``TORCHBAY_MALLOC_TUNING=0``. Other C libraries (musl, macOS) ignore the variables.

And how every worker process and worker template starts (:func:`start_worker`), written
once. Imports nothing but the standard library: the CLI starts its first one before its own
imports (server/early_workers.py), as ``spawning.spawn_process`` and ``ForkServer.start`` start
the others.
"""

from __future__ import annotations

import re
import secrets
import socket
import subprocess
from collections.abc import Mapping, MutableMapping

MALLOC_DEFAULTS = {
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(256 << 20),
}
OPT_OUT = "TORCHBAY_MALLOC_TUNING"
# A secret that starts each of a worker's own log lines (worker/main.configure_logging): the
# frontend writes a line that starts with it as the worker formatted it, and everything else a
# worker writes (a print, a record's further lines) as a model-log message of its own
# (observe/logfiles.WorkerOutput). So a client's text that a handler logs or prints, line breaks
# and all, never passes for a record of the server's.
# (Not TORCHBAY_*: those are settings, config/sources.py; an unknown one is reported.)
LOG_TAG = "_TORCHBAY_LOG_TAG"
_OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")


def worker_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` (the server's environment, or the one configured for the model) with
    ``MALLOC_DEFAULTS`` added, unless ``base`` already chooses an allocator or opts out."""
    env = dict(base)
    if env.get(OPT_OUT, "").strip().lower() in ("0", "false", "no", "off"):
        return env
    if any(name in env.get("LD_PRELOAD", "") for name in _OTHER_ALLOCATORS):
        return env
    if "glibc.malloc." in env.get("GLIBC_TUNABLES", ""):
        return env
    if any(key in env for key in MALLOC_DEFAULTS):
        return env  # the user set one: theirs, and the other left at glibc's default
    env.update(MALLOC_DEFAULTS)
    return env


def tag_worker_logs(environ: MutableMapping[str, str]) -> str:
    """A fresh ``LOG_TAG`` in ``environ`` (the CLI's, before it spawns a worker); the tag."""
    tag = environ[LOG_TAG] = f"<{secrets.token_hex(12)}>"
    return tag


def visible_env(base: Mapping[str, str], hidden: str) -> dict[str, str]:
    """``base`` without the variables whose whole name matches the regex ``hidden``
    (TorchServe's ``blacklist_env_vars``; "": all of it)."""
    if not hidden:
        return dict(base)
    pattern = re.compile(hidden)
    return {k: v for k, v in base.items() if not pattern.fullmatch(k)}


def start_worker(
    python: str,
    log_format: str,
    env: Mapping[str, str],
    *,
    template: bool = False,
    output: int | None = None,
) -> tuple[subprocess.Popen, socket.socket]:
    """``python -m torchbay.server.worker`` (``template``: the worker template) on a new
    socketpair (``SOCK_SEQPACKET`` for the template), with ``env`` as it is and ``output`` as its
    stdout and stderr (None: ours): the process and our end of the pair. In its own session: a
    signal to the server's process group (Ctrl-C, ``timeout``) must not kill a worker mid-batch;
    the frontend stops it after draining, and one whose frontend vanished sees EOF on its socket
    and exits."""
    module = "torchbay.server.worker.template" if template else "torchbay.server.worker"
    kind = socket.SOCK_SEQPACKET if template else socket.SOCK_STREAM
    ours, theirs = socket.socketpair(socket.AF_UNIX, kind)
    try:
        proc = subprocess.Popen(
            [python, "-m", module, "--fd", str(theirs.fileno()), "--log-format", log_format],
            pass_fds=(theirs.fileno(),),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            start_new_session=True,
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return proc, ours


__all__ = [
    "LOG_TAG",
    "MALLOC_DEFAULTS",
    "OPT_OUT",
    "start_worker",
    "tag_worker_logs",
    "visible_env",
    "worker_env",
]
