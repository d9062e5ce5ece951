"""Triton's logging extension (plane/log_settings.py): a verbose level reads back as it was set,
as Triton echoes it (5 read back 1), up to Triton's uint32."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from torchbay.server.errors import BadRequest
from torchbay.server.plane import log_settings

ON = {"log_info": True, "log_warning": True, "log_error": True}


@pytest.fixture(autouse=True)
def put_back() -> Iterator[None]:
    level = log_settings.level_set()
    log_settings.update(ON)  # a server's start: info and up
    yield
    log_settings.restore(level)


def test_a_verbose_level_reads_back_as_set() -> None:
    assert log_settings.update({"log_verbose_level": 5})["log_verbose_level"] == 5
    assert log_settings.current()["log_verbose_level"] == 5
    assert log_settings.update({"log_info": True})["log_verbose_level"] == 5  # unchanged
    top = (1 << 32) - 1
    assert log_settings.update({"log_verbose_level": top})["log_verbose_level"] == top
    off = log_settings.update({"log_verbose_level": 0})
    assert off["log_verbose_level"] == 0 and off["log_info"] is True


def test_restore_forgets_the_verbose_level() -> None:
    before = log_settings.level_set()
    log_settings.update({"log_verbose_level": 7})
    log_settings.restore(before)
    assert log_settings.current()["log_verbose_level"] in (0, 1)  # as the level says, not 7


@pytest.mark.parametrize("bad", [-1, 1 << 32, 2.5, True, "3"])
def test_verbose_levels_out_of_uint32_are_refused(bad: object) -> None:
    with pytest.raises(BadRequest, match="log_verbose_level"):
        log_settings.update({"log_verbose_level": bad})
