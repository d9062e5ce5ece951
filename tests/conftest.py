"""Session-wide test defaults.

gRPC always listens, as in TorchServe (127.0.0.1:7070 and :7071 by default). Servers the tests
start as processes and that inherit this environment (``torchbay serve`` in test_shutdown, the
benchmarks' ManagedServer) take free ports instead, so two test runs on one machine never fight
over 7070. In-process servers get port 0 from tests/server/conftest.make_config.
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHBAY_GRPC_INFERENCE_PORT", "0")
os.environ.setdefault("TORCHBAY_GRPC_MANAGEMENT_PORT", "0")
