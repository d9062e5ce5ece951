"""Record which config snapshots TorchServe 0.12 keeps in ``logs/config`` (answers.json): it
writes one per management change and never deletes one.

Run from the repository root, TorchServe in its own virtualenv (tests/data/torchserve_0.12/
README.md says how it was installed; Java 17 on PATH)::

    PATH=/work/ts-venv/bin:$PATH /work/ts-venv/bin/python \\
        tests/data/torchserve/snapshots/record.py

It builds ``tiny.mar`` with torch-model-archiver, then starts TorchServe twice in one folder
(``--foreground --disable-token-auth --enable-model-api``, snapshots on, ports 18520-18522): the
first run registers and unregisters the model ``ROUNDS`` times, the second (a restart, which
restores the newest snapshot) changes nothing. After each run it lists ``logs/config``: each
file's kind (``startup``, ``snapshot``, ``shutdown``), in name order, and their count.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import tsrun  # noqa: E402

ROUNDS = 3
PORTS = {"inference": 18520, "management": 18521, "metrics": 18522}
HANDLER = HERE.parent / "log_forging" / "echo_handler.py"


def kinds(config_dir: Path) -> list[str]:
    """The snapshots' kinds in name order (the names start with their time)."""
    names = sorted(p.name for p in config_dir.iterdir())
    return [name.split("-", 1)[1].removesuffix(".cfg") for name in names]


def model_entry(path: Path) -> dict:
    """The ``tiny`` model's entry (its versions) in the ``model_snapshot`` of the snapshot
    ``path``, as TorchServe wrote it (Java's properties escapes undone)."""
    escapes = {"n": "\n", "t": "\t", "r": "\r", "f": "\f"}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("model_snapshot="):
            value = re.sub(r"\\(.)", lambda m: escapes.get(m[1], m[1]), line.split("=", 1)[1])
            return json.loads(value)["models"]["tiny"]
    raise SystemExit(f"no model_snapshot in {path}")


def run(work: Path, store: Path, calls: list[tuple[str, str]]) -> list[int]:
    """One TorchServe run in ``work``: each (method, path) of ``calls`` on the management
    port, in order; their statuses."""
    config = {f"{k}_address": f"http://127.0.0.1:{port}" for k, port in PORTS.items()}
    config["disable_system_metrics"] = "true"
    properties = tsrun.properties(work / "config.properties", config)
    argv = tsrun.command(store, properties)
    argv.remove("--ncs")
    base = f"http://127.0.0.1:{PORTS['inference']}"
    management = f"http://127.0.0.1:{PORTS['management']}"
    env = {"LOG_LOCATION": str(work / "logs")}
    with tsrun.running(argv, work, tsrun.pinged(base), env=env, ports=list(PORTS.values())):
        return [tsrun.call(management + path, method)[0] for method, path in calls]


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="ts-snapshots-"))
    try:
        store = work / "store"
        store.mkdir()
        tsrun.archive("tiny", HANDLER, store)
        cycle = [("POST", "/models?url=tiny.mar&initial_workers=1"), ("DELETE", "/models/tiny")]
        first = run(work, store, cycle * ROUNDS)
        after_first = kinds(work / "logs" / "config")
        # The snapshot written once the first registration was answered: the model's entry.
        entry = model_entry(sorted((work / "logs" / "config").iterdir())[1])
        # The first java server may still be exiting (its ports closed): its pid file would
        # make this start refuse ("TorchServe is already running").
        (work / "tmp" / ".model_server.pid").unlink(missing_ok=True)
        second = run(work, store, [])
        after_second = kinds(work / "logs" / "config")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    record = {
        "command": tsrun.recorder_command(__file__),
        "torchserve": tsrun.torchserve_version(),
        "rounds": ROUNDS,
        "first_run": {"statuses": first, "kinds": after_first, "count": len(after_first)},
        "second_run": {"statuses": second, "kinds": after_second, "count": len(after_second)},
        "registered_entry": entry,
    }
    tsrun.write_json(HERE / "answers.json", record)


if __name__ == "__main__":
    main()
