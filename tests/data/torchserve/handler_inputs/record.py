"""Record what a TorchServe 0.12 handler receives for each kind of input (answers.json):
inputs_handler.py, packed by torch-model-archiver and loaded at start-up, asked every case of
cases.py through ``/predictions/inputs`` and SageMaker's ``/invocations``. Run from the
repository root (one command):

    PATH=/work/ts-venv/bin:$PATH \\
        /work/ts-venv/bin/python tests/data/torchserve/handler_inputs/record.py
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # cases, tsrun
import cases  # noqa: E402
import tsrun  # noqa: E402


def main() -> None:
    with tsrun.archived("inputs", HERE / "inputs_handler.py") as (work, store):
        ports = [tsrun.free_port() for _ in range(5)]
        config = tsrun.properties(
            work / "config.properties",
            {
                "inference_address": f"http://127.0.0.1:{ports[0]}",
                "management_address": f"http://127.0.0.1:{ports[1]}",
                "metrics_address": f"http://127.0.0.1:{ports[2]}",
                "grpc_inference_port": str(ports[3]),
                "grpc_management_port": str(ports[4]),
            },
        )
        argv = tsrun.command(store, config, "--models", "inputs=inputs.mar")
        base = f"http://127.0.0.1:{ports[0]}"
        ready = lambda: tsrun.call(base + "/ping", "GET")[0] == 200  # noqa: E731
        with tsrun.running(argv, work, ready, ports=ports[:3]):
            answers = [{"id": c[0], **cases.ask(ports[0], *c[1:])} for c in cases.CASES]
        tsrun.write_answers(HERE, tsrun.recorder_command(__file__), answers, work)


if __name__ == "__main__":
    main()
