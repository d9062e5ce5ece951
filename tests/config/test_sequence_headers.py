"""TorchServe's ``ts_header_key_sequence_id`` / ``_start`` / ``_end`` keys (ConfigManager.java:
they rename the headers that carry a sequence's id, start and end), read from every source.
What a server does with the names is in tests/server/test_sequence_headers_live.py."""

from __future__ import annotations

from pathlib import Path

from torchbay.server.config.sources import load_server_config

KEYS = """ts_header_key_sequence_id=Session-Id
ts_header_key_sequence_start = session-start
ts_header_key_sequence_end: session-end
"""


def _load(tmp_path: Path, text: str, env: dict[str, str] | None = None):
    (tmp_path / "config.properties").write_text(text, encoding="utf-8")
    return load_server_config(ts_config=None, env=env or {}, cli={}, cwd=tmp_path)


def test_the_keys_rename_the_sequence_headers(tmp_path: Path) -> None:
    """Was: each noted as "ignored unknown key", and the headers kept TorchServe's names."""
    config, notes = _load(tmp_path, KEYS)
    assert not [n for n in notes if "ts_header_key" in n], notes
    assert config.ts_header_key_sequence_id == "Session-Id"
    assert config.sequence_headers == ("session-id", "session-start", "session-end")


def test_the_defaults_are_torchserve_s_names(tmp_path: Path) -> None:
    config, _ = _load(tmp_path, "")
    assert config.sequence_headers == (
        "ts_request_sequence_id",
        "ts_request_sequence_start",
        "ts_request_sequence_end",
    )


def test_torchserve_s_environment_variables_name_them_too(tmp_path: Path) -> None:
    env = {"TS_TS_HEADER_KEY_SEQUENCE_ID": "x-seq", "TS_ENABLE_ENVVARS_CONFIG": "true"}
    config, _ = _load(tmp_path, "enable_envvars_config=true\n", env)
    assert config.sequence_headers[0] == "x-seq"


def test_a_name_that_is_no_header_name_or_names_another_keeps_the_default(
    tmp_path: Path,
) -> None:
    text = (
        "ts_header_key_sequence_id=session id\n"
        "ts_header_key_sequence_end=ts_request_sequence_start\n"
    )
    config, notes = _load(tmp_path, text)
    assert config.sequence_headers == (
        "ts_request_sequence_id",
        "ts_request_sequence_start",
        "ts_request_sequence_end",
    )
    warned = [n for n in notes if n.startswith("WARNING") and "ts_header_key_sequence" in n]
    assert len(warned) == 2, notes
