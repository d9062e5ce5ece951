"""Record how TorchServe 0.12's log4j2 rolls its log files over (answers.json): by time and by
size into ``<name>.<date>.log.gz``, how many archives it keeps, and which lines are lost.

Run from the repository root (Java 17 on PATH, TorchServe 0.12 in /work/ts-venv)::

    /work/ts-venv/bin/python tests/data/torchserve/log_rollover/record.py

``Probe.java`` logs through the log4j2 inside TorchServe's own ``model-server.jar`` with
``log4j2.xml``: TorchServe's ``ts_log`` appender with its period cut from a day to a second and
its size from 100 MB to 2 KB (nobody waits a day): ``LINES`` lines a second for ``SECONDS``
seconds. A second run starts on a ``ts_log.log`` last written earlier and writes one line.
Each archive's name is kept as its position in time (``<period>``), with its line count.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import tsrun  # noqa: E402

JAR = "/work/ts-venv/lib/python3.11/site-packages/ts/frontend/model-server.jar"
LINES, SECONDS = 200, 8


def probe(logs: Path, lines: int, seconds: int) -> None:
    config = f"-Dlog4j2.configurationFile={HERE / 'log4j2.xml'}"
    argv = ["java", config, "-cp", JAR, str(HERE / "Probe.java"), str(lines), str(seconds)]
    env = {**os.environ, "LOG_LOCATION": str(logs)}
    subprocess.run(argv, check=True, env=env, capture_output=True)


def listing(logs: Path) -> dict[str, int]:
    """{name, its time replaced by <period>: lines}; the archives in name (time) order."""
    out = {}
    for path in sorted(logs.iterdir()):
        text = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        name = re.sub(r"\d\d-\d\d-\d\d", "<period>", path.name)
        out[f"{len(out)}: {name}"] = text.decode().count("\n")
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp) / "logs"
        probe(logs, LINES, SECONDS)
        first = listing(logs)
        stale = Path(tmp) / "stale"
        stale.mkdir()
        (stale / "ts_log.log").write_text("a line of an earlier period\n")
        time.sleep(2)  # log4j2 dates the file by its creation: the period before this one
        probe(stale, 1, 1)
        second = listing(stale)
    record = {
        "command": tsrun.recorder_command(__file__).replace("PATH=/work/ts-venv/bin:$PATH ", ""),
        "torchserve": tsrun.torchserve_version(),
        "java": subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.split(
            "\n"
        )[0],
        "written": LINES * SECONDS,
        "files": first,
        "kept": sum(first.values()),
        "stale_start": second,
    }
    tsrun.write_json(HERE / "answers.json", record)
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
