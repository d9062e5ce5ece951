"""A worker's exit (worker/exits.exit_now): no interpreter teardown, but nothing a handler relies
on at exit is lost: its atexit hooks run, its buffered prints and log lines are written, and the
exit code is the one given."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import atexit, logging, sys
from torchbay.server.worker.exits import exit_now

logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
atexit.register(lambda: print("hook ran", end="|"))
print("buffered print", end="|")  # a pipe: block-buffered, still in the buffer here
logging.getLogger("handler").info("a log line")
exit_now(3)
print("never")
"""


def test_exit_now_runs_atexit_hooks_flushes_and_keeps_the_code() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3
    assert done.stdout == "buffered print|hook ran|"
    assert done.stderr.strip() == "a log line"


BLOCKED = """
import atexit, sys, time
from torchbay.server.worker.exits import exit_now

atexit.register(time.sleep, 600)  # as multiprocessing's hook joining a child that never ends
print("buffered print", end="|")
exit_now(3)
"""


def test_an_exit_hook_that_blocks_holds_the_exit_only_so_long() -> None:
    """A hook that never returns (multiprocessing's join of a non-daemon child the handler left)
    held the worker's exit for good; it gets EXIT_HOOKS_S (5 s), then the process ends with its
    code and its output."""
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3
    assert done.stdout == "buffered print|"
