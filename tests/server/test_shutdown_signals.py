"""``torchbay serve`` as a real process: the signals an operator sends while it stops."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from .test_shutdown import _start

pytestmark = pytest.mark.slow


def _signal_until_gone(proc: subprocess.Popen, sig: int, every: float = 0.005) -> int:
    """SIGTERM ``proc``, then send ``sig`` every ``every`` s until it exits (a supervisor that
    repeats its signal, Ctrl-C held down): every step of the stop meets one, its last ones
    too. The exit status."""
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(every)
        try:
            proc.send_signal(sig)
        except ProcessLookupError:  # exited meanwhile
            break
    try:
        return proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("again", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_signals_repeated_through_the_stop_leave_a_clean_exit(model_store, tmp_path, again):
    # Was: a signal in the last steps, after the event loop had closed (which put the default
    # handlers back), killed the process: exit -15 (SIGTERM) or -2 (KeyboardInterrupt) for a
    # stop that had drained and stopped its workers. Kubernetes and systemd saw a failed exit.
    proc, _ = _start(model_store, tmp_path)
    assert _signal_until_gone(proc, again) == 0
    out = (tmp_path / "serve.log").read_text()
    assert "Traceback" not in out, out[-3000:]
    assert out.count("second interrupt") <= 1  # logged once, not once per Ctrl-C
