"""``--log-config``: which files torchbay takes (Python logging configs), which it ignores (log4j2
XML, TorchServe's), and the one-line errors for the rest. In process: no server needed."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from torchbay.server.errors import ConfigError, TorchbayError
from torchbay.server.observe.logfiles import read_log_config


@pytest.fixture
def saved_logging() -> Iterator[None]:
    """Put the root logger and the loggers a config touches back as they were."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    mine = logging.getLogger("cli_log_config_test")
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)
    for handler in list(mine.handlers):
        mine.removeHandler(handler)
        handler.close()
    mine.setLevel(logging.NOTSET)
    mine.propagate = True


def test_a_yaml_dictconfig_keeps_the_existing_loggers(tmp_path, saved_logging):
    out = tmp_path / "out.log"
    path = tmp_path / "logging.yaml"
    path.write_text(
        "version: 1\n"
        "handlers:\n"
        f"  f: {{class: logging.FileHandler, filename: '{out}'}}\n"
        "loggers:\n  cli_log_config_test: {handlers: [f], level: INFO, propagate: false}\n"
    )
    existing = logging.getLogger("torchbay.serve")
    config = read_log_config(str(path))
    assert config.kind == "dict" and config.data is not None
    assert config.data["disable_existing_loggers"] is False  # Python's default would be True
    config.apply()
    assert not existing.disabled
    logging.getLogger("cli_log_config_test").info("through the config")
    for handler in logging.getLogger("cli_log_config_test").handlers:
        handler.flush()
    assert out.read_text() == "through the config\n"


def test_an_ini_fileconfig(tmp_path, saved_logging):
    out = tmp_path / "out.log"
    path = tmp_path / "logging.ini"
    path.write_text(
        "[loggers]\nkeys=root,mine\n\n[handlers]\nkeys=f\n\n[formatters]\nkeys=plain\n\n"
        "[logger_root]\nlevel=WARNING\nhandlers=\n\n"
        "[logger_mine]\nlevel=INFO\nhandlers=f\nqualname=cli_log_config_test\npropagate=0\n\n"
        f"[handler_f]\nclass=FileHandler\nformatter=plain\nargs=('{out}',)\n\n"
        "[formatter_plain]\nformat=INI %(message)s\n"
    )
    config = read_log_config(str(path))
    assert config.kind == "ini"
    config.apply()
    logging.getLogger("cli_log_config_test").info("through the ini file")
    for handler in logging.getLogger("cli_log_config_test").handlers:
        handler.flush()
    assert out.read_text() == "INI through the ini file\n"


def test_a_log4j2_file_is_ignored_with_one_warning(tmp_path, caplog):
    path = tmp_path / "log4j2.xml"
    path.write_text('<?xml version="1.0"?>\n<Configuration><Loggers/></Configuration>\n')
    config = read_log_config(str(path))
    assert config.kind == "log4j"
    with caplog.at_level(logging.INFO, logger="torchbay.logs"):
        config.apply()
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "log4j2 file: torchbay logs through Python's logging and ignores it" in caplog.text


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.json", "[1, 2]", "--log-config a.json: not a logging dictConfig"),
        ("a.json", "{not json", "--log-config a.json: Expecting property name"),
        ("a.yaml", "version: [1\n", "--log-config a.yaml: while parsing a flow sequence"),
        ("a.yaml", "handlers: {}\n", "--log-config a.yaml: not a logging dictConfig"),
        ("a.ini", "no section here\n", "--log-config a.ini: File contains no section headers."),
        ("a.ini", "[handlers]\nkeys=\n", "--log-config a.ini: no [loggers] section"),
    ],
)
def test_a_bad_file_is_one_line_naming_it(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        read_log_config(str(path))
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value) and str(tmp_path) not in str(caught.value)


def test_a_missing_file():
    with pytest.raises(TorchbayError) as caught:
        read_log_config("nowhere.yaml")
    assert str(caught.value) == "--log-config file not found: nowhere.yaml"
    assert not isinstance(caught.value, ConfigError)  # exit 1, as TorchServe's launcher
