"""A worker's exit (worker/main.exit_now): no interpreter teardown, but nothing a handler relies
on at exit is lost: its atexit hooks run, its buffered prints and log lines are written, and the
exit code is the one given."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import atexit, logging, sys
from torchbay.server.worker.main import exit_now

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
