"""What earlier runs left beside the log files: the ``ts_log.log.1`` ... that torchbay wrote
before it rolled over daily (they stayed for good, outside every count), and the archive a kill
cut in the middle of its gzip (a ``.gz`` cut short, kept as if whole, beside the file it came
from, never gzipped again)."""

from __future__ import annotations

import gzip
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchbay.server.observe.logs import ACCESS_LOGGER, configure_logging
from torchbay.server.observe.rollover import Rotation

from .log_helpers import kept_root_logging

# 2 December 2026, 23:00 local time.
DAY_ONE = time.mktime((2026, 12, 2, 23, 0, 0, 0, 0, -1))


@pytest.fixture
def root_logging() -> Iterator[logging.Logger]:
    with kept_root_logging() as root:
        yield root


def _run(files: dict[Path, object], rotation: Rotation, lines: int = 0) -> None:
    """A server's logging over ``files``: ``lines`` records written, then stopped (which waits
    for the gzips)."""
    pipeline = configure_logging("text", level=logging.INFO, files=files, rotation=rotation)
    try:
        for i in range(lines):
            logging.getLogger("torchbay.serve").info("record %03d of today", i)
            assert pipeline.flush(timeout=10)
    finally:
        pipeline()


def test_the_files_of_the_size_rollover_count_among_the_kept_archives(root_logging, tmp_path):
    server = tmp_path / "ts_log.log"
    for n in (1, 2, 3):
        old = tmp_path / f"ts_log.log.{n}"
        old.write_text(f"a line of an older torchbay ({n})\n")
        os.utime(old, (DAY_ONE - 86400 * n, DAY_ONE - 86400 * n))
    rotation = Rotation(max_bytes=500, backups=2, clock=lambda: DAY_ONE)
    _run({server: None}, rotation, lines=40)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[-1] == "ts_log.log" and len(names) == 3, names
    assert all(name.startswith("ts_log.02-Dec.") for name in names[:-1]), names


def test_a_gzip_cut_short_by_a_kill_is_done_again_at_the_next_start(root_logging, tmp_path):
    """ts_log: what torchbay before ``.part`` left (a ``.gz`` cut short, written in place);
    access_log: a ``.gz.part`` cut short. Each archive is whole after the next start."""
    text = "".join(f"a line of 2 December, {i}\n" for i in range(2000))
    whole = gzip.compress(text.encode())
    for stem, leftover in (("ts_log", ".log.gz"), ("access_log", ".log.gz.part")):
        (tmp_path / f"{stem}.02-Dec.log").write_text(text)
        (tmp_path / f"{stem}.02-Dec{leftover}").write_bytes(whole[: len(whole) // 2])
    files = {
        tmp_path / "ts_log.log": None,
        tmp_path / "access_log.log": lambda r: r.name == ACCESS_LOGGER,
    }
    _run(files, Rotation(clock=lambda: DAY_ONE + 86400))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "access_log.02-Dec.log.gz",
        "access_log.log",
        "ts_log.02-Dec.log.gz",
        "ts_log.log",
    ]
    for stem in ("ts_log", "access_log"):
        assert gzip.decompress((tmp_path / f"{stem}.02-Dec.log.gz").read_bytes()).decode() == text
