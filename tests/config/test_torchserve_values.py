"""Values read as TorchServe 0.12's ConfigManager reads them (config/ts_values.py): its booleans,
the names of its environment variables, ``TS_ALLOWED_URLS``'s gate and ``$$NAME$$`` in
config.properties (ConfigManager.java: Boolean.parseBoolean, setSystemVars,
use_env_allowed_urls, resolveEnvVarVals)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from torchbay.server.config.sources import load_server_config
from torchbay.server.errors import ConfigError

DATA = Path(__file__).resolve().parents[1] / "data" / "torchserve_0.12"


def _load(tmp_path: Path, text: str, env: dict[str, str] | None = None):
    (tmp_path / "config.properties").write_text(text, encoding="utf-8")
    return load_server_config(ts_config=None, env=env or {}, cli={}, cwd=tmp_path)


def test_booleans_are_true_only_as_true_as_in_java(tmp_path: Path) -> None:
    """Was: pydantic's reading, so ``disable_token_authorization=1`` turned authorization off
    and ``enable_model_api=yes`` turned the model API on, where TorchServe keeps both as they
    were (Boolean.parseBoolean("1") is false); ``enable_metrics_api=enabled`` warned and kept
    true where TorchServe turns the metrics API off."""
    text = (
        "disable_token_authorization=1\n"
        "enable_model_api=yes\n"
        "enable_metrics_api=enabled\n"
        "limit_max_image_pixels=TRUE\n"
        "model_metrics_auto_detect=True\n"
        "disable_system_metrics=false\n"
    )
    config, notes = _load(tmp_path, text)
    assert config.disable_token_authorization is False
    assert config.enable_model_api is False
    assert config.enable_metrics_api is False
    assert config.limit_max_image_pixels is True and config.model_metrics_auto_detect is True
    assert config.disable_system_metrics is False
    warned = sorted(n.split(":")[1].split("=")[0].strip() for n in notes if "reads as" in n)
    assert warned == ["disable_token_authorization", "enable_metrics_api", "enable_model_api"]


def test_decode_input_request_is_true_only_as_exactly_true(tmp_path: Path) -> None:
    """TorchServe's worker decodes a body only when TS_DECODE_INPUT_REQUEST is "true"."""
    config, notes = _load(tmp_path, "decode_input_request=True\n")
    assert config.decode_input_request is False
    assert any("decode_input_request='True' reads as false" in n for n in notes), notes
    config, _ = _load(tmp_path, "decode_input_request=true\n")
    assert config.decode_input_request is True


def test_an_environment_boolean_is_read_as_java_reads_it(tmp_path: Path) -> None:
    env = {"TS_DISABLE_TOKEN_AUTHORIZATION": "1"}
    config, _ = _load(tmp_path, "enable_envvars_config=true\n", env)
    assert config.disable_token_authorization is False


def test_torchserve_s_environment_variable_names(tmp_path: Path) -> None:
    """Was: ignored, since torchbay looked for TS_TOKEN_EXPIRATION_MIN and
    TS_TS_HEADER_KEY_SEQUENCE_ID (TS_<KEY>), not ConfigManager's field names."""
    env = {"TS_TOKEN_EXPIRATION_TIME_MIN": "5", "TS_HEADER_KEY_SEQUENCE_ID": "x-seq"}
    config, _ = _load(tmp_path, "enable_envvars_config=true\n", env)
    assert config.token_expiration_min == 5
    assert config.sequence_headers[0] == "x-seq"


def test_allowed_urls_from_the_environment_need_use_env_allowed_urls(tmp_path: Path) -> None:
    """Was: TS_ALLOWED_URLS widened the registrable URLs with enable_envvars_config alone, where
    TorchServe reads it only with use_env_allowed_urls=true (and the key was noted as one
    torchbay does not use)."""
    env = {"TS_ALLOWED_URLS": "https://.*"}
    config, notes = _load(tmp_path, "enable_envvars_config=true\n", env)
    assert config.allowed_urls == []
    assert any("use_env_allowed_urls" in n and "TS_ALLOWED_URLS" in n for n in notes), notes
    text = "enable_envvars_config=true\nuse_env_allowed_urls=true\n"
    config, notes = _load(tmp_path, text, env)
    assert config.allowed_urls == ["https://.*"]
    assert not [n for n in notes if "use_env_allowed_urls" in n], notes


def test_dollar_dollar_names_an_environment_variable(tmp_path: Path) -> None:
    """Was: kept as written, so the address was refused and a number kept its default."""
    env = {"PORT": "9123", "QUEUE": "7"}
    text = "inference_address=http://127.0.0.1:$$PORT$$\njob_queue_size=$$QUEUE$$\n"
    config, _ = _load(tmp_path, text, env)
    assert config.inference.port == 9123 and config.job_queue_size == 7
    with pytest.raises(ConfigError, match="MISSING"):
        _load(tmp_path, "job_queue_size=$$MISSING$$\n")


def test_every_key_of_torchserve_s_config_manager_is_known(tmp_path: Path) -> None:
    """Every key TorchServe 0.12's ConfigManager reads (recorded from its jar, with the command,
    in tests/data/torchserve_0.12/config_keys.txt) is honoured, or noted as TorchServe's: never
    noted as an "unknown key", as a typo is. Was: version (in every snapshot TorchServe
    writes), python, debug, cpu_launcher_enable, cpu_launcher_args, metric_time_interval and
    ts_open_inference_protocol were."""
    lines = (DATA / "config_keys.txt").read_text(encoding="utf-8").splitlines()
    keys = [line.split()[1] for line in lines if line and not line.startswith("#")]
    assert len(keys) > 60 and "ts_open_inference_protocol" in keys
    for key in keys:
        try:
            _, notes = _load(tmp_path, f"{key}=x\n")
        except (ConfigError, ValidationError):  # honoured: "x" is no value for it
            continue
        assert not [n for n in notes if "unknown" in n], (key, notes)
