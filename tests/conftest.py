"""Session-wide test defaults.

gRPC always listens, as in TorchServe (127.0.0.1:7070 and :7071 by default). Servers the tests
start as processes and that inherit this environment (``torchbay serve`` in test_shutdown, the
benchmarks' ManagedServer) take free ports instead, so two test runs on one machine never fight
over 7070. In-process servers get port 0 from tests/server/conftest.make_config.
"""

from __future__ import annotations

import os
import signal

os.environ.setdefault("TORCHBAY_GRPC_INFERENCE_PORT", "0")
os.environ.setdefault("TORCHBAY_GRPC_MANAGEMENT_PORT", "0")

# A suite started in the background by a shell without job control runs with SIGINT ignored,
# and every command a test starts inherits that (an ignored signal stays ignored across exec):
# the tests that Ctrl-C a command (test_cli_daemon_stops, test_bench_stop, test_model_exits)
# waited out their timeouts. Handled here, SIGINT is at its default in every command started,
# as in a terminal's foreground job. (Each of those commands reset it in a ``preexec_fn``:
# Python run between fork and exec in a process with gRPC's threads, and one such child
# aborted, -6, in a full run.)
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
