"""How long a live server takes to stop, and where the time goes (the shutdown's phases).

    .venv/bin/python results/shutdown/stop_time.py [--runs 3]

Each run starts a TorchbayServer in this process (the tests' LiveServer: 127.0.0.1 port 0, the
probe archive, one worker, the worker template on) and stops it at once, timing each phase of
``TorchbayServer.shutdown``: the drain, the registry's stop (the workers' exit), the worker
template's close. Run from the repository root (it imports ``tests.server.conftest``).
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from tests.server.conftest import ASSETS, LiveServer, build_store, make_config


class _Dirs:
    def mktemp(self, prefix: str) -> pathlib.Path:
        return pathlib.Path(tempfile.mkdtemp(prefix=prefix))


def _timed(record: dict[str, float], label: str, call: Any, is_async: bool) -> Any:
    @functools.wraps(call)
    async def timed_async(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await call(*args, **kwargs)
        finally:
            record[label] = time.perf_counter() - start

    @functools.wraps(call)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            record[label] = time.perf_counter() - start

    return timed_async if is_async else timed


def one_run(store: pathlib.Path) -> dict[str, float]:
    live = LiveServer(make_config(store, load_models=["probe=probe.mar"])).start()
    server, record = live.server, {}
    registry = server.registry
    registry.stop = _timed(record, "workers_stop_s", registry.stop, True)
    if server.forks is not None:
        server.forks.close = _timed(record, "template_close_s", server.forks.close, False)
    start = time.perf_counter()
    live.stop()
    record["stop_s"] = time.perf_counter() - start
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    store = build_store(_Dirs(), "stop", {"probe": str(ASSETS / "probe_handler.py")})
    runs = [one_run(store) for _ in range(args.runs)]
    for key in runs[0]:
        values = [r[key] for r in runs]
        each = ", ".join(f"{v:.2f}" for v in values)
        print(f"{key:18s} median {statistics.median(values):6.2f} s  ({each})")


if __name__ == "__main__":
    main()
