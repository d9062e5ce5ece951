"""Function nodes held at gates the test opens (test_workflow_lifecycle.py): files in ``GATES``,
which the test writes into its copy of this file before it packs the ``.war``.

``slow_start`` finishes loading only once the ``load`` file exists (it writes ``loading``
first), ``stuck`` once ``unstuck`` exists (written only at the end), ``broken`` fails to load
once ``stuck`` loads; ``held`` answers only once
``release`` exists (it writes ``held`` first); ``relay`` (and ``one__two``) pass their input
on. The waits are bounded (300 s): a failing test leaves no worker waiting.
"""

import os
import time

GATES = "@GATES@"


def _wait(gate, mark):
    open(os.path.join(GATES, mark), "w").close()
    end = time.monotonic() + 300
    while not os.path.exists(os.path.join(GATES, gate)) and time.monotonic() < end:
        time.sleep(0.02)


def _raw(row):
    body = row.get("body") if row.get("body") is not None else row.get("data")
    return bytes(body or b"")


def slow_start(data, context):
    if data is None:  # the call at load
        _wait("load", "loading")
        return None
    return [_raw(row) for row in data]


def stuck(data, context):
    if data is None:
        _wait("unstuck", "stuck")
        return None
    return [_raw(row) for row in data]


def broken(data, context):
    if data is None:
        _wait("stuck", "broken")
        raise RuntimeError("broken does not load")
    return [_raw(row) for row in data]


def held(data, context):
    if data is None:
        return None
    _wait("release", "held")
    return [_raw(row) for row in data]


def relay(data, context):
    if data is None:
        return None
    return [_raw(row) for row in data]


def one__two(data, context):
    return relay(data, context)
