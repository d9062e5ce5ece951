"""Log files roll over (``log_file_max_bytes``, ``log_file_backups``), as TorchServe's log4j2
configuration keeps 5 files of 100 MB: they grew without bound before, until the disk (or a
container's emptyDir) was full."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from torchbay.server.config.settings import ServerConfig
from torchbay.server.observe.logs import ACCESS_LOGGER, RequestRecord, configure_logging, log_access
from torchbay.server.observe.logwriter import Rotation
from torchbay.server.observe.ts_families import MetricsLog

from .cli_helpers import clean_env, kill_tree, predict, serve_foreground
from .log_helpers import SCOPE, kept_root_logging


@pytest.fixture
def root_logging() -> Iterator[logging.Logger]:
    with kept_root_logging() as root:
        yield root


def _generations(path: Path) -> list[Path]:
    """``path`` and its rolled-over files, oldest first."""
    rolled = sorted(path.parent.glob(f"{path.name}.*"), key=lambda p: -int(p.suffix[1:]))
    return [*rolled, path]


def test_files_roll_over_keeping_the_newest_lines(root_logging, tmp_path) -> None:
    """Access lines (the fast path, written in bursts) and other records (logging's ``emit``):
    each file stays under the bound, ``backups`` older ones are kept, the oldest dropped, and
    what is kept is the newest lines, in order."""
    access, other = tmp_path / "access_log.log", tmp_path / "ts_log.log"
    files = {access: lambda r: r.name == ACCESS_LOGGER, other: lambda r: r.name != ACCESS_LOGGER}
    pipeline = configure_logging(
        "text", level=logging.INFO, files=files, rotation=Rotation(max_bytes=1000, backups=2)
    )
    try:
        for i in range(60):
            log_access(RequestRecord(SCOPE, f"m{i:03d}", None, 200, 0.01, 0.001, None))
            logging.getLogger("torchbay.serve").info("record %03d", i)
            assert pipeline.flush(timeout=5)
    finally:
        pipeline()
    for path, mark in ((access, "model=m"), (other, "record ")):
        kept = _generations(path)
        assert [p.name for p in kept] == [f"{path.name}.2", f"{path.name}.1", path.name]
        assert all(0 < p.stat().st_size <= 1000 for p in kept)
        numbers = [
            int(line.split(mark, 1)[1][:3])
            for p in kept
            for line in p.read_text().splitlines()
            if mark in line
        ]
        assert numbers == list(range(60 - len(numbers), 60)) and len(numbers) < 60


def test_no_rotation_when_max_bytes_is_0(root_logging, tmp_path) -> None:
    log = tmp_path / "ts_log.log"
    pipeline = configure_logging(
        "text", level=logging.INFO, files={log: None}, rotation=Rotation(max_bytes=0)
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
    metrics = MetricsLog(tmp_path, Rotation(max_bytes=500, backups=1))
    for i in range(100):
        metrics.put("ts_metrics.log", f"Requests2XX.Count:1|#Level:Host|#hostname:h,n:{i:03d}")
        time.sleep(0.005)  # a burst is written whole: small ones here
    metrics.close()
    kept = _generations(tmp_path / "ts_metrics.log")
    assert [p.name for p in kept] == ["ts_metrics.log.1", "ts_metrics.log"]
    assert all(p.stat().st_size <= 500 for p in kept)
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
    names = sorted(p.name for p in logs.iterdir())
    assert "access_log.log.1" in names and "access_log.log.2" not in names, names
    assert all(p.stat().st_size <= 600 for p in _generations(logs / "access_log.log"))
