"""Record how a TorchServe handler sees SageMaker's request headers on TorchServe 0.12
(answers.json): one model loaded at start-up, as the SageMaker toolkit starts it, asked through
``POST /invocations`` with the headers SageMaker's hosting sends, spelled as it spells them, and
once all in lower case. Run from the repository root (one command):

    PATH=/work/ts-venv/bin:$PATH \\
        /work/ts-venv/bin/python tests/data/torchserve/sagemaker_headers/record.py

TorchServe runs on ports 18440-18444 (``tsrun.START_FLAGS``); the archive is made by its
torch-model-archiver from headers_handler.py (here).
"""

from __future__ import annotations

import http.client
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import tsrun  # noqa: E402

PORTS = (18440, 18441, 18442)
BASE = f"http://127.0.0.1:{PORTS[0]}"
# (id, headers): each POSTed to /invocations with the body b'{"x": 1}'.
CASES = [
    (
        "sagemaker_headers",
        {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "X-Amzn-SageMaker-Custom-Attributes": "trace_id=abc,tenant=t1",
            "X-Amzn-SageMaker-Target-Model": "model-a.tar.gz",
        },
    ),
    ("lower_case", {"content-type": "text/csv", "x-amzn-sagemaker-custom-attributes": "k=v"}),
]


def ask(headers: dict[str, str]) -> dict:
    """POST /invocations with ``headers`` spelled as given (http.client keeps the spelling;
    urllib would capitalize each name)."""
    connection = http.client.HTTPConnection("127.0.0.1", PORTS[0], timeout=120)
    try:
        connection.request("POST", "/invocations", body=b'{"x": 1}', headers=headers)
        response = connection.getresponse()
        return {"status": response.status, "body": json.loads(response.read())}
    finally:
        connection.close()


def main() -> None:
    with tsrun.archived("headers", HERE / "headers_handler.py") as (work, store):
        config = tsrun.properties(
            work / "config.properties",
            {
                "inference_address": f"http://127.0.0.1:{PORTS[0]}",
                "management_address": f"http://127.0.0.1:{PORTS[1]}",
                "metrics_address": f"http://127.0.0.1:{PORTS[2]}",
                "grpc_inference_port": "18443",  # not 7070: another TorchServe may hold it
                "grpc_management_port": "18444",
            },
        )
        argv = tsrun.command(store, config, "--models", "headers=headers.mar")
        ready = lambda: tsrun.call(BASE + "/ping", "GET")[0] == 200  # noqa: E731
        with tsrun.running(argv, work, ready, ports=PORTS):
            answers = [{"id": case, "headers": h, **ask(h)} for case, h in CASES]
        command = tsrun.recorder_command(__file__)
        tsrun.write_answers(HERE, command, answers, work)


if __name__ == "__main__":
    main()
