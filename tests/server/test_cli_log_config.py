"""``--log-config``: which files torchbay takes (Python logging configs), which it ignores (log4j2
XML, TorchServe's), and the one-line errors for the rest. In process: no server needed."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchbay.server.errors import ConfigError, TorchbayError
from torchbay.server.observe.logfiles import LogConfig, read_log_config

# Two configs that send the test's logger, at INFO, to the file ``{out}`` and nowhere else.
YAML_CONFIG = """\
version: 1
handlers:
  f:
    class: logging.FileHandler
    filename: '{out}'
loggers:
  cli_log_config_test:
    handlers: [f]
    level: INFO
    propagate: false
"""
INI_CONFIG = """\
[loggers]
keys=root,mine

[handlers]
keys=f

[formatters]
keys=plain

[logger_root]
level=WARNING
handlers=

[logger_mine]
level=INFO
handlers=f
qualname=cli_log_config_test
propagate=0

[handler_f]
class=FileHandler
formatter=plain
args=('{out}',)

[formatter_plain]
format=INI %(message)s
"""


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


def _configured(tmp_path: Path, name: str, template: str) -> tuple[LogConfig, Path]:
    """``template`` written to ``tmp_path / name`` with its ``{out}`` filled in, then read:
    (the config, the log file ``{out}`` names)."""
    out = tmp_path / "out.log"
    path = tmp_path / name
    path.write_text(template.format(out=out))
    return read_log_config(str(path)), out


def _logged(out: Path, message: str) -> str:
    """Log ``message`` at INFO on the test's logger (configured to write into ``out``): what
    ``out`` holds then."""
    mine = logging.getLogger("cli_log_config_test")
    mine.info(message)
    for handler in mine.handlers:
        handler.flush()
    return out.read_text()


def test_a_yaml_dictconfig_keeps_the_existing_loggers(tmp_path, saved_logging):
    config, out = _configured(tmp_path, "logging.yaml", YAML_CONFIG)
    existing = logging.getLogger("torchbay.serve")
    assert config.kind == "dict" and config.data is not None
    assert config.data["disable_existing_loggers"] is False  # Python's default would be True
    config.apply()
    assert not existing.disabled
    assert _logged(out, "through the config") == "through the config\n"


def test_an_ini_fileconfig(tmp_path, saved_logging):
    config, out = _configured(tmp_path, "logging.ini", INI_CONFIG)
    assert config.kind == "ini"
    config.apply()
    assert _logged(out, "through the ini file") == "INI through the ini file\n"


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


@pytest.mark.parametrize(
    ("name", "handler", "reason"),
    [
        (
            "a.ini",
            "[handler_f]\nclass=FileHandler\nargs=('{out}',)\n",
            "[Errno 2] No such file or directory",
        ),
        ("a.ini", "[handler_f]\nclass=FileHandler\nargs=(nowhere,)\n", "name 'nowhere' is not"),
        ("a.ini", "[handler_f]\nclass=FileHandler\nargs=((,\n", "invalid syntax"),
        (
            "a.yaml",
            "handlers:\n  f: {{class: logging.FileHandler, filename: '{out}'}}\n",
            "Unable to configure handler 'f': [Errno 2] No such file or directory",
        ),
    ],
)
def test_a_config_that_fails_to_apply_is_one_line_with_its_reason(
    tmp_path, saved_logging, name, handler, reason
):
    """A handler whose log file's folder does not exist, or whose INI args do not evaluate:
    the start printed a traceback (fileConfig's FileNotFoundError, NameError, SyntaxError) or
    dictConfig's "Unable to configure handler 'f'" without why."""
    if name.endswith(".ini"):
        head = "[loggers]\nkeys=root\n[handlers]\nkeys=f\n[formatters]\nkeys=\n"
        text = head + "[logger_root]\nhandlers=f\n" + handler
    else:
        text = "version: 1\n" + handler + "root: {{handlers: [f]}}\n"
    out = tmp_path / "missing" / "out.log"
    path = tmp_path / name
    path.write_text(text.format(out=out))
    with pytest.raises(ConfigError) as caught:
        read_log_config(str(path)).apply()
    message = str(caught.value)
    assert message.startswith(f"--log-config {name}: ") and reason in message, message
    assert "\n" not in message
