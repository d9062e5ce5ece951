"""Counts the garbage collector's runs in a process started with TB_GC=FILE (gc_count.py puts
this folder on PYTHONPATH): SIGUSR1 resets the counts, SIGUSR2 writes them to FILE as JSON."""

import os

if os.environ.get("TB_GC"):
    import gc
    import json
    import signal
    import time

    _counts = {"n": [0, 0, 0], "s": [0.0, 0.0, 0.0]}
    _began = [0.0]

    def _timed(phase: str, info: dict) -> None:
        if phase == "start":
            _began[0] = time.perf_counter()
        else:
            _counts["n"][info["generation"]] += 1
            _counts["s"][info["generation"]] += time.perf_counter() - _began[0]

    def _reset(*_: object) -> None:
        _counts.update(n=[0, 0, 0], s=[0.0, 0.0, 0.0])

    def _dump(*_: object) -> None:
        with open(os.environ["TB_GC"], "w") as out:
            json.dump(_counts, out)

    gc.callbacks.append(_timed)
    signal.signal(signal.SIGUSR1, _reset)
    signal.signal(signal.SIGUSR2, _dump)
