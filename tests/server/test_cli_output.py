"""``WorkerOutput``: what the server's children write on stdout and stderr becomes model-log
lines; a server started with ``--start`` leaves the terminal once up, its stderr going to
``ts_log.log``. Each case runs in a fresh interpreter: it rewires fds 1 and 2."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
from pathlib import Path

from torchbay.server.observe.logfiles import MAX_LINE

SCRIPT = textwrap.dedent(
    """
    import subprocess, sys, time
    from pathlib import Path
    from torchbay.server.observe.logfiles import WorkerOutput
    from torchbay.server.observe.logs import configure_logging

    log_file = Path(sys.argv[1])
    output = WorkerOutput()
    pipeline = configure_logging("json", stream=output.console, files={log_file: None})
    output.start(pipeline)
    child = "import sys; print('child says hi'); print('child warns', file=sys.stderr)"
    subprocess.run([sys.executable, "-c", child], check=True)  # inherits fds 1 and 2
    deadline = time.monotonic() + 30  # the reader thread takes them in its own time
    while log_file.read_text().count("child") < 2 and time.monotonic() < deadline:
        pipeline.flush()
        time.sleep(0.01)
    print("frontend print before")
    output.detach_console(stderr_to=Path(sys.argv[2]))
    print("frontend print after")
    print("frontend traceback after", file=sys.stderr)
    output.close()
    pipeline()
    """
)


def _run(script: str, folder: Path) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    """``script`` run with a model log and a frontend error log in ``folder``: (the run, its
    model log, its error log)."""
    log_file, err_file = folder / "model.log", folder / "ts_log.log"
    err_file.write_text("")
    proc = subprocess.run(
        [sys.executable, "-c", script, str(log_file), str(err_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc, log_file, err_file


def test_children_output_is_logged_and_a_detached_console_is_quiet(tmp_path: Path) -> None:
    proc, log_file, err_file = _run(SCRIPT, tmp_path)
    records = [json.loads(line) for line in log_file.read_text().splitlines()]
    messages = {r["message"]: r["logger"] for r in records}
    # A child's print on either stream is one model-log record, formatted by the frontend.
    assert messages == {"child says hi": "torchbay.model_log", "child warns": "torchbay.model_log"}
    # The console (stdout) had them too, until it was detached; the frontend's own print stays
    # a plain print on stdout, never a model-log line.
    console = proc.stdout.splitlines()
    assert console[-1] == "frontend print before" and len(console) == 3
    assert {json.loads(line)["message"] for line in console[:2]} == set(messages)
    assert "after" not in proc.stdout and proc.stderr == ""
    assert err_file.read_text() == "frontend traceback after\n"


def test_a_child_writing_without_newlines_is_logged_in_bounded_lines(tmp_path: Path) -> None:
    # A handler's progress bar (CR only between updates) and a 3 MiB write with no newline.
    child = "import sys; sys.stdout.write('\\rstep 1\\rstep 2\\r\\n' + 'x' * (3 << 20) + '\\n')"
    script = SCRIPT.replace(
        "child = \"import sys; print('child says hi'); print('child warns', file=sys.stderr)\"",
        f"child = {child!r}",
    ).replace('.count("child") < 2', '.count("x") < (3 << 20)')
    _, log_file, _ = _run(script, tmp_path)
    messages = [json.loads(line)["message"] for line in log_file.read_text().splitlines()]
    assert messages[:2] == ["step 1", "step 2"]
    assert all(set(m) == {"x"} and len(m) <= MAX_LINE for m in messages[2:])
    assert sum(map(len, messages[2:])) == 3 << 20


ROLLED = textwrap.dedent(
    """
    import gzip, logging, sys, time
    from pathlib import Path
    from torchbay.server.observe.logfiles import WorkerOutput
    from torchbay.server.observe.logs import configure_logging
    from torchbay.server.observe.rollover import Rotation

    log_file = Path(sys.argv[2])
    now = [time.mktime((2026, 12, 2, 23, 59, 0, 0, 0, -1))]
    output = WorkerOutput()
    rotation = Rotation(clock=lambda: now[0])
    pipeline = configure_logging("text", stream=output.console, files={log_file: None},
                                 rotation=rotation, level=logging.INFO)
    output.start(pipeline)
    output.detach_console(stderr_to=log_file)
    print("traceback before midnight", file=sys.stderr)
    now[0] += 120  # 3 December: the next line rolls ts_log.log over
    logging.getLogger("torchbay.serve").info("a line of 3 December")
    assert pipeline.flush(timeout=30)
    print("traceback after midnight", file=sys.stderr)
    output.close()
    pipeline()
    """
)


def test_a_detached_servers_stderr_follows_its_log_file_over_a_rollover(tmp_path: Path) -> None:
    """``--start``'s server writes a last traceback (stderr) into ``ts_log.log``. It held the
    file open: once the file rolled over (daily), the traceback went into the archive, gzipped
    and deleted by then, and the deleted file's space stayed held while the server ran."""
    _, _, err_file = _run(ROLLED, tmp_path)
    archive = tmp_path / "ts_log.02-Dec.log.gz"
    assert "traceback before midnight" in gzip.decompress(archive.read_bytes()).decode()
    now = err_file.read_text()
    assert "a line of 3 December" in now and "traceback after midnight\n" in now


LINKED = textwrap.dedent(
    """
    import logging, subprocess, sys, time
    from pathlib import Path
    from torchbay.server.observe.logfiles import WorkerOutput
    from torchbay.server.observe.logs import configure_logging

    linked, plain = Path(sys.argv[1]), Path(sys.argv[2])
    linked.symlink_to("/dev/stdout")  # as a container's image links its log files
    output = WorkerOutput()
    pipeline = configure_logging("text", stream=output.console,
                                 files={linked: None, plain: None}, level=logging.INFO)
    output.start(pipeline)
    logging.getLogger("torchbay.serve").info("one record")
    assert pipeline.flush(timeout=30)
    # A worker's line, after the record went out: the pipe is read in order, so once it is
    # in, a copy of the record that came back through the pipe would be in too.
    child = "print('child marker')"
    subprocess.run([sys.executable, "-c", child], check=True)
    deadline = time.monotonic() + 30
    while "child marker" not in plain.read_text() and time.monotonic() < deadline:
        pipeline.flush()
        time.sleep(0.01)
    output.close()
    pipeline()
    """
)


def test_a_log_file_linked_to_stdout_is_not_read_back_as_worker_output(tmp_path: Path) -> None:
    """``logs/ts_log.log`` linked to ``/dev/stdout``: the file was opened once fd 1 was the
    workers' pipe, so each line written to it came back as a worker's line, was logged again,
    and again, without end (each time one prefix longer)."""
    linked, plain = tmp_path / "linked.log", tmp_path / "plain.log"
    argv = [sys.executable, "-c", LINKED, str(linked), str(plain)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # Once on the console, once through the file linked to stdout; the child's line as well.
    assert sum("torchbay.serve: one record" in line for line in lines) == 2, lines
    assert sum("torchbay.model_log: child marker" in line for line in lines) == 2, lines
    assert len(lines) == 4, lines
    assert plain.read_text().count("\n") == 2  # the record and the child's line, once each
