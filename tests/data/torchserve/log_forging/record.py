"""Record how TorchServe 0.12 writes a handler's output that carries a client's line breaks
(answers.json): the lines of ``logs/model_log.log`` and ``logs/ts_log.log`` that hold the text
``echo_handler.py`` logged and printed for one request whose body forges a log line.

Run from the repository root, TorchServe in its own virtualenv (tests/data/torchserve_0.12/
README.md says how it was installed; Java 17 on PATH)::

    PATH=/work/ts-venv/bin:$PATH /work/ts-venv/bin/python \\
        tests/data/torchserve/log_forging/record.py

It builds ``echo.mar`` with torch-model-archiver, starts TorchServe in a fresh folder on ports
18480-18482 (``--foreground --ncs --disable-token-auth``, no system metrics), POSTs ``BODY`` as
text/plain to ``/predictions/echo``, stops it and reads its logs. Timestamps and worker numbers
are replaced by ``<time>`` and ``<n>``; the escape characters are kept as TorchServe wrote them.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import tsrun  # noqa: E402

FORGED = "2026-01-01 00:00:00,000 INFO torchbay.access: forged"
# A line that forges a text record, one that forges a JSON record, and ANSI escapes that move a
# terminal's cursor up a line and erase it (what `tail -f` shows of the line before).
BODY = f"hello\n{FORGED}\n" + '{"logger": "torchbay.serve", "message": "forged"}\x1b[1A\x1b[2K'
PORTS = {"inference": 18480, "management": 18481, "metrics": 18482}
_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{3}")
_WORKER = re.compile(r"W-\d+-")


def normalised(line: str) -> str:
    return _WORKER.sub("W-<n>-", _TIME.sub("<time>", line))


def main() -> None:
    with tsrun.archived("echo", HERE / "echo_handler.py") as (work, store):
        config = {f"{k}_address": f"http://127.0.0.1:{port}" for k, port in PORTS.items()}
        config["disable_system_metrics"] = "true"
        properties = tsrun.properties(work / "config.properties", config)
        argv = tsrun.command(store, properties, "--models", "echo=echo.mar")
        argv.remove("--enable-model-api")
        base = f"http://127.0.0.1:{PORTS['inference']}"
        env = {"LOG_LOCATION": str(work / "logs")}
        with tsrun.running(argv, work, tsrun.pinged(base), env=env, ports=list(PORTS.values())):
            answer = tsrun.call(base + "/predictions/echo", "POST", BODY.encode())
        logs = {}
        for name in ("model_log.log", "ts_log.log"):
            text = (work / "logs" / name).read_text()
            marked = ("hello", "forged", "secret seen")
            logs[name] = [
                normalised(line) for line in text.splitlines() if any(m in line for m in marked)
            ]
    record = {
        "command": tsrun.recorder_command(__file__),
        "torchserve": tsrun.torchserve_version(),
        "body": BODY,
        "status": answer[0],
        "logs": logs,
    }
    tsrun.write_json(HERE / "answers.json", record)


if __name__ == "__main__":
    main()
