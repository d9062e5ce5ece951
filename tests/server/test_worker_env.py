"""The worker's environment (serving/worker_env.py): glibc malloc thresholds by default, the
user's own allocator choice left alone; and a spawned worker really starts with them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.server.conftest import until
from torchbay.server.early_workers import _start
from torchbay.server.serving.handle import Spawned, spawn_process
from torchbay.server.serving.worker_env import MALLOC_DEFAULTS, worker_env

TUNED = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "268435456"}


def test_defaults_are_added_and_the_rest_kept() -> None:
    env = worker_env({"PATH": "/bin", "HOME": "/root"})
    assert env == {"PATH": "/bin", "HOME": "/root", **TUNED}
    assert MALLOC_DEFAULTS == TUNED


@pytest.mark.parametrize(
    "given",
    [
        {"TORCHBAY_MALLOC_TUNING": "0"},
        {"TORCHBAY_MALLOC_TUNING": "off"},
        {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"},
        {"LD_PRELOAD": "libtcmalloc_minimal.so.4"},
        {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"},
        {"MALLOC_MMAP_THRESHOLD_": "131072"},
        {"MALLOC_TRIM_THRESHOLD_": "0"},
    ],
)
def test_an_environment_that_chooses_its_allocator_is_left_alone(given: dict[str, str]) -> None:
    base = {"PATH": "/bin", **given}
    assert worker_env(base) == base


def test_unrelated_preload_and_tunables_still_get_the_defaults() -> None:
    base = {"LD_PRELOAD": "libfaketime.so", "GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=4096"}
    assert worker_env(base) == {**base, **TUNED}


def _environ(spawned: Spawned) -> list[bytes]:
    """The process's environment once its exec is through: until the kernel has set up the new
    program's environment, /proc/PID/environ reads empty (a window a loaded host widens)."""
    path = Path(f"/proc/{spawned.proc.pid}/environ")
    try:
        until(lambda: spawned.proc.poll() is not None or path.read_bytes() != b"", "exec done")
        assert spawned.proc.poll() is None, "the spawned worker exited"
        return path.read_bytes().split(b"\0")
    finally:
        spawned.discard()


@pytest.mark.skipif(
    not Path("/proc/self/environ").exists(),
    reason="Linux only: a running process's environment is readable only from /proc/PID/environ",
)
def test_spawned_workers_start_with_them() -> None:
    """Every way a worker process starts: spawned by the pool, and by the CLI before its own
    imports, a worker or the worker template (whose allocator settings its forks inherit)."""
    spawned = spawn_process({"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})
    output = os.open(os.devnull, os.O_WRONLY)  # the early process's stdout and stderr
    try:
        early = [_start("text", output, template=template) for template in (False, True)]
    finally:
        os.close(output)
    (worker, none), (template, env) = early
    assert none is None and env is not None and env == worker_env(os.environ)
    environs = [_environ(s) for s in (spawned, Spawned(worker.proc, worker.sock))]
    environs.append(_environ(Spawned(template.proc, template.sock)))
    for environ in environs:
        for key, value in TUNED.items():
            assert f"{key}={value}".encode() in environ
