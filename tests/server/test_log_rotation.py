"""Log files roll over as TorchServe's log4j2 configuration rolls them: daily and at
``log_file_max_bytes``, into ``<name>.<dd-Mon>.log.gz``, ``log_file_backups`` kept. They grew
without bound before, until the disk (or a container's emptyDir) was full; then they rolled by
size only, into ``name.1``..., where a TorchServe operator looks for ``ts_log.02-Dec.log.gz``."""

from __future__ import annotations

import gzip
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from torchbay.server.config.settings import ServerConfig
from torchbay.server.observe.logs import ACCESS_LOGGER, RequestRecord, configure_logging, log_access
from torchbay.server.observe.rollover import Rotation
from torchbay.server.observe.ts_families import MetricsLog

from .cli_helpers import clean_env, kill_tree, predict, serve_foreground
from .log_helpers import SCOPE, kept_root_logging


@pytest.fixture
def root_logging() -> Iterator[logging.Logger]:
    with kept_root_logging() as root:
        yield root


# 2 December 2026, 23:59:00 local time: the next day starts 60 s later.
DAY_ONE = time.mktime((2026, 12, 2, 23, 59, 0, 0, 0, -1))


class Clock:
    """The time the log files read the day from; a test moves it."""

    def __init__(self, now: float = DAY_ONE) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _archives(path: Path) -> list[Path]:
    """``path`` 's archives (``ts_log.02-Dec.log.gz``, ``ts_log.02-Dec.2.log.gz``), oldest
    first (by the time each was archived, then by its number in its day)."""
    stem = path.name.removesuffix(".log")
    named = re.compile(rf"{re.escape(stem)}\.\d\d-[A-Z][a-z]{{2}}(\.\d+)?\.log\.gz")
    found = [(p, named.fullmatch(p.name)) for p in path.parent.iterdir()]
    order = [(p.stat().st_mtime_ns, int((m[1] or ".1")[1:]), p) for p, m in found if m]
    return [p for *_, p in sorted(order)]


def _text(path: Path) -> str:
    return gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()


def _generations(path: Path) -> list[Path]:
    """``path`` 's archives, oldest first, then ``path``."""
    return [*_archives(path), path]


def test_files_roll_over_keeping_the_newest_lines(root_logging, tmp_path) -> None:
    """Access lines (the fast path, written in bursts) and other records (logging's ``emit``):
    each file stays under the bound, ``backups`` older ones are kept, the oldest dropped, and
    what is kept is the newest lines, in order."""
    access, other = tmp_path / "access_log.log", tmp_path / "ts_log.log"
    files = {access: lambda r: r.name == ACCESS_LOGGER, other: lambda r: r.name != ACCESS_LOGGER}
    rotation = Rotation(max_bytes=1000, backups=2, clock=Clock())
    pipeline = configure_logging("text", level=logging.INFO, files=files, rotation=rotation)
    try:
        for i in range(60):
            log_access(RequestRecord(SCOPE, f"m{i:03d}", None, 200, 0.01, 0.001, None))
            logging.getLogger("torchbay.serve").info("record %03d", i)
            assert pipeline.flush(timeout=5)
    finally:
        pipeline()
    for path, mark in ((access, "model=m"), (other, "record ")):
        kept = _generations(path)
        stem = path.name.removesuffix(".log")
        assert len(kept) == 3 and all(p.name.startswith(f"{stem}.02-Dec.") for p in kept[:2])
        assert all(0 < len(_text(p).encode()) <= 1000 for p in kept)
        numbers = [
            int(line.split(mark, 1)[1][:3])
            for p in kept
            for line in _text(p).splitlines()
            if mark in line
        ]
        assert numbers == list(range(60 - len(numbers), 60)) and len(numbers) < 60


def test_a_new_day_rolls_the_files_over_as_torchserve_names_them(root_logging, tmp_path) -> None:
    """At the first write after midnight each file becomes ``<name>.<dd-Mon>.log.gz`` (the day
    it holds, log4j2's ``%d{dd-MMM}``), gzipped, and the day's lines start a new file."""
    clock = Clock()
    access, server = tmp_path / "access_log.log", tmp_path / "ts_log.log"
    files = {access: lambda r: r.name == ACCESS_LOGGER, server: None}
    rotation = Rotation(clock=clock)
    pipeline = configure_logging("text", level=logging.INFO, files=files, rotation=rotation)
    try:
        log_access(RequestRecord(SCOPE, "before", None, 200, 0.01, 0.001, None))
        logging.getLogger("torchbay.serve").info("before midnight")
        assert pipeline.flush(timeout=10)
        clock.now = DAY_ONE + 120  # 3 December, 00:01
        log_access(RequestRecord(SCOPE, "after", None, 200, 0.01, 0.001, None))
        logging.getLogger("torchbay.serve").info("after midnight")
        assert pipeline.flush(timeout=10)
    finally:
        pipeline()  # closes the files: waits for their gzip
    for path, stem in ((access, "access_log"), (server, "ts_log")):
        assert [p.name for p in _archives(path)] == [f"{stem}.02-Dec.log.gz"]
        archived = _text(path.with_name(f"{stem}.02-Dec.log.gz"))
        assert "before" in archived and "after" not in archived
        assert "after" in path.read_text() and "before" not in path.read_text()
    assert not list(tmp_path.glob("*.02-Dec.log"))  # nothing left uncompressed


def test_a_file_of_an_earlier_day_rolls_over_at_the_first_write(root_logging, tmp_path) -> None:
    """A ``ts_log.log`` last written yesterday (the server was down at midnight) rolls over
    into yesterday's archive at the first write, as log4j2 rolls it."""
    server = tmp_path / "ts_log.log"
    server.write_text("a line of 2 December\n")
    os.utime(server, (DAY_ONE, DAY_ONE))
    clock = Clock(DAY_ONE + 86400)
    rotation = Rotation(clock=clock)
    pipeline = configure_logging(
        "text", level=logging.INFO, files={server: None}, rotation=rotation
    )
    try:
        logging.getLogger("torchbay.serve").info("a line of 3 December")
        assert pipeline.flush(timeout=10)
    finally:
        pipeline()
    assert _text(tmp_path / "ts_log.02-Dec.log.gz") == "a line of 2 December\n"
    assert "3 December" in server.read_text() and "2 December" not in server.read_text()


def test_a_file_deleted_under_the_server_starts_again_at_the_next_day(root_logging, tmp_path):
    """``rm logs/ts_log.log`` while the server runs: its lines go to the deleted file until the
    next rollover, which opens a new ``ts_log.log`` (nothing to archive) and writes on."""
    clock = Clock()
    server = tmp_path / "ts_log.log"
    pipeline = configure_logging(
        "text", level=logging.INFO, files={server: None}, rotation=Rotation(clock=clock)
    )
    try:
        logging.getLogger("torchbay.serve").info("before")
        assert pipeline.flush(timeout=10)
        server.unlink()
        clock.now = DAY_ONE + 120
        logging.getLogger("torchbay.serve").info("after")
        assert pipeline.flush(timeout=10)
    finally:
        pipeline()
    assert "after" in server.read_text()
    assert _archives(server) == []


def test_a_log_file_that_is_a_pipe_is_written_and_never_rolled(root_logging, tmp_path) -> None:
    """``access_log.log`` a FIFO that a log shipper reads (or a link to ``/dev/stdout``, a pipe
    in a container): its lines went nowhere, with one traceback ("underlying stream is not
    seekable": the size check's ``tell``). Written as they come, never rolled over."""
    clock, fifo = Clock(), tmp_path / "access_log.log"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # the writer's open does not wait
    try:
        files = {fifo: lambda r: r.name == ACCESS_LOGGER}
        rotation = Rotation(max_bytes=10, clock=clock)
        pipeline = configure_logging("text", level=logging.INFO, files=files, rotation=rotation)
        try:
            for i in range(4):
                clock.now += 60  # the second line is of 3 December
                log_access(RequestRecord(SCOPE, f"m{i}", None, 200, 0.01, 0.001, None))
                assert pipeline.flush(timeout=10)
        finally:
            pipeline()
        read = os.read(reader, 1 << 16)
    finally:
        os.close(reader)
    assert [line.rsplit("model=", 1)[1][:2] for line in read.decode().splitlines()] == [
        "m0",
        "m1",
        "m2",
        "m3",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["access_log.log"]


def test_a_storm_of_rollovers_is_archived_by_one_thread_per_file(root_logging, tmp_path):
    """``log_file_max_bytes`` far too small: every write rolls the file over. Each file's
    archives are gzipped in turn by one thread, never a thread per rollover."""
    server = tmp_path / "ts_log.log"
    rotation = Rotation(max_bytes=100, backups=3, clock=Clock())
    pipeline = configure_logging(
        "text", level=logging.INFO, files={server: None}, rotation=rotation
    )
    most = 0
    try:
        for i in range(200):
            logging.getLogger("torchbay.serve").info("record %03d of a storm", i)
            assert pipeline.flush(timeout=10)
            gzipping = [t for t in threading.enumerate() if t.name == "torchbay-log-gzip"]
            most = max(most, len(gzipping))
    finally:
        pipeline()
    assert most == 1
    kept = _archives(server)
    assert len(kept) == 3 and all(p.suffix == ".gz" for p in kept)
    assert "record 199" in server.read_text()


def test_no_rotation_when_max_bytes_is_0(root_logging, tmp_path) -> None:
    log = tmp_path / "ts_log.log"
    pipeline = configure_logging(
        "text", level=logging.INFO, files={log: None}, rotation=Rotation(max_bytes=0, clock=Clock())
    )
    try:
        for i in range(200):
            logging.getLogger("torchbay.serve").info("record %03d", i)
        assert pipeline.flush(timeout=5)
    finally:
        pipeline()
    assert [p.name for p in tmp_path.iterdir()] == ["ts_log.log"]
    assert len(log.read_text().splitlines()) == 200


def test_metrics_logs_roll_over(tmp_path) -> None:
    metrics = MetricsLog(tmp_path, Rotation(max_bytes=500, backups=1, clock=Clock()))
    for i in range(100):
        metrics.put("ts_metrics.log", f"Requests2XX.Count:1|#Level:Host|#hostname:h,n:{i:03d}")
        time.sleep(0.005)  # a burst is written whole: small ones here
    metrics.close()
    kept = _generations(tmp_path / "ts_metrics.log")
    assert len(kept) == 2 and re.fullmatch(r"ts_metrics\.\d\d-\w{3}(\.\d+)?\.log\.gz", kept[0].name)
    assert all(len(_text(p).encode()) <= 500 for p in kept)
    assert kept[-1].read_text().splitlines()[-1].endswith("n:099")


def test_the_settings_are_bounded() -> None:
    assert ServerConfig().log_file_max_bytes == 100 * 1024 * 1024
    assert ServerConfig().log_file_backups == 5
    for bad in ({"log_file_max_bytes": -1}, {"log_file_backups": -1}, {"log_file_backups": 10**6}):
        with pytest.raises(ValidationError):
            ServerConfig(**bad)


@pytest.mark.slow
def test_a_served_access_log_rolls_over(tmp_path, talk_store) -> None:
    """``log_file_max_bytes`` / ``log_file_backups`` in config.properties, a real server: the
    access log rolls over while it serves."""
    logs, config = tmp_path / "logs", tmp_path / "config.properties"
    config.write_text("log_file_max_bytes=600\nlog_file_backups=1\n")
    env = clean_env(tmp_path / "tmp", LOG_LOCATION=str(logs))
    args = [
        "--ts-config",
        str(config),
        "--model-store",
        str(talk_store),
        "--models",
        "talk=talk.mar",
    ]
    proc, info = serve_foreground([*args, "--disable-token-auth"], tmp_path, env)
    try:
        url = info["inference"]
        for _ in range(20):
            assert predict(url).status_code == 200
            time.sleep(0.02)  # bursts of one line: each write checks the bound
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        kill_tree(proc.pid)
    kept = _generations(logs / "access_log.log")
    assert len(kept) == 2, sorted(p.name for p in logs.iterdir())
    assert all(len(_text(p).encode()) <= 600 for p in kept)
