from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import ValidationError

from torchbay.server.config.settings import ModelConfig, ModelSpec, ServerConfig, parse_address
from torchbay.server.config.sources import load_server_config, resolve_model_config
from torchbay.server.errors import ConfigError

MODELS_JSON = """models={\\
  "noop": {\\
    "1.0": {\\
        "defaultVersion": true,\\
        "marName": "noop.mar",\\
        "minWorkers": 2,\\
        "maxWorkers": 4,\\
        "batchSize": 8,\\
        "maxBatchDelay": 50,\\
        "responseTimeout": 30,\\
        "someFutureKey": 1\\
    }\\
  }\\
}
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def load(
    tmp_path: Path,
    *,
    env: dict[str, str] | None = None,
    cli: dict | None = None,
    ts_config: str | Path | None = None,
) -> tuple[ServerConfig, list[str]]:
    return load_server_config(ts_config=ts_config, env=env or {}, cli=cli or {}, cwd=tmp_path)


# ----------------------------------------------------------------------------- server defaults
def test_defaults_are_torchbay_safe(tmp_path: Path) -> None:
    config, notes = load(tmp_path)
    assert notes == []
    assert config.inference == parse_address("http://127.0.0.1:8080")
    assert (config.management.port, config.metrics.port) == (8081, 8082)
    assert config.default_workers_per_model == 1
    assert config.allowed_urls == []
    assert config.enable_model_api is False
    assert config.disable_token_authorization is False
    assert config.key_file == tmp_path / "key_file.json"
    assert config.max_batch_delay_ms == 100 and config.job_queue_size == 100


def test_whole_torchserve_config_loads_with_ignored_keys_noted(tmp_path: Path) -> None:
    path = write(
        tmp_path / "ts.properties",
        "inference_address=http://0.0.0.0:9080\n"
        "vmargs=-Xmx4g -XX:+UseContainerSupport\n"
        "number_of_netty_threads=32\n"
        "grpc_inference_port=7070\n"
        "grpc_inference_max_connection_age_ms=60000\n"
        "install_py_dep_per_model=true\n"
        "totally_made_up=1\n"
        "default_response_timeout=60\n"
        "max_batch_delay=20\n"
        "enable_model_api=true\n"
        "load_models=noop.mar, resnet=resnet-18.mar\n"
        "model_store=store\n" + MODELS_JSON,
    )
    config, notes = load(tmp_path, ts_config=path)
    assert config.inference.host == "0.0.0.0" and config.inference.port == 9080
    assert config.default_response_timeout_s == 60
    assert config.max_batch_delay_ms == 20
    assert config.enable_model_api is True
    assert config.grpc_inference_port == 7070  # TorchServe's gRPC keys are read, not ignored
    assert config.grpc_inference_max_connection_age_ms == 60000
    assert config.model_store == tmp_path / "store"
    assert config.model_specs() == [
        ModelSpec(name=None, url="noop.mar"),
        ModelSpec(name="resnet", url="resnet-18.mar"),
    ]
    noop = config.models["noop"]["1.0"]
    assert (noop.min_workers, noop.max_workers, noop.batch_size) == (2, 4, 8)
    assert noop.default_version is True and noop.mar_name == "noop.mar"
    text = "\n".join(notes)
    for key in (
        "vmargs",
        "number_of_netty_threads",
        "install_py_dep_per_model",
        "totally_made_up",
        "someFutureKey",
    ):
        assert key in text
    assert "ignored unknown key 'totally_made_up'" in text


@pytest.mark.parametrize("where", ["flag", "env", "cwd"])
def test_config_file_discovery(tmp_path: Path, where: str) -> None:
    other = tmp_path / "elsewhere"
    other.mkdir()
    write(other / "a.properties", "job_queue_size=7\n")
    write(tmp_path / "config.properties", "job_queue_size=9\n")
    if where == "flag":
        config, _ = load(
            tmp_path,
            ts_config="elsewhere/a.properties",
            env={"TS_CONFIG_FILE": "config.properties"},
        )
        assert config.job_queue_size == 7
    elif where == "env":
        config, _ = load(tmp_path, env={"TS_CONFIG_FILE": str(other / "a.properties")})
        assert config.job_queue_size == 7
    else:
        config, notes = load(tmp_path)
        assert config.job_queue_size == 9
        assert notes == [f"configuration from {tmp_path / 'config.properties'}"]


def test_missing_explicit_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load(tmp_path, ts_config="nope.properties")


def test_precedence_properties_ts_env_torchbay_env_cli(tmp_path: Path) -> None:
    path = write(
        tmp_path / "c.properties",
        "enable_envvars_config=true\nbatch_size=2\njob_queue_size=3\nmax_request_size=4\n"
        "number_of_gpu=5\n",
    )
    env = {
        "TS_JOB_QUEUE_SIZE": "30",
        "TS_MAX_REQUEST_SIZE": "40",
        "TS_NUMBER_OF_GPU": "50",
        "TORCHBAY_MAX_REQUEST_SIZE": "400",
        "TORCHBAY_NUMBER_OF_GPU": "500",
    }
    config, _ = load(
        tmp_path, ts_config=path, env=env, cli={"number_of_gpu": 1000, "model_store": None}
    )
    assert config.batch_size == 2  # properties only
    assert config.job_queue_size == 30  # TS_ env over properties
    assert config.max_request_size == 400  # TORCHBAY_ env over TS_ env
    assert config.number_of_gpu == 1000  # CLI over everything
    assert config.model_store is None  # a None flag is "not set"


def test_ts_env_needs_enable_envvars_config(tmp_path: Path) -> None:
    env = {"TS_JOB_QUEUE_SIZE": "30", "TS_SOMETHING_ELSE": "x", "TS_CONFIG_FILE": ""}
    config, notes = load(tmp_path, env=env)
    assert config.job_queue_size == 100
    assert any("TS_JOB_QUEUE_SIZE" in n and "enable_envvars_config" in n for n in notes)
    config, _ = load(tmp_path, env={**env, "TORCHBAY_ENABLE_ENVVARS_CONFIG": "true"})
    assert config.job_queue_size == 30


def test_torchbay_env_accepts_field_and_torchserve_names_and_coerces(tmp_path: Path) -> None:
    env = {
        "TORCHBAY_MAX_BATCH_DELAY": "7",
        "TORCHBAY_DISABLE_TOKEN_AUTHORIZATION": "TRUE",
        "TORCHBAY_LIMIT_MAX_IMAGE_PIXELS": "false",
        "TORCHBAY_ALLOWED_URLS": r"https://models\.example\.com/.*,file:///srv/.*",
        "TORCHBAY_LOAD_MODELS": "all",
        "TORCHBAY_MODLE_STORE": "typo",
    }
    config, notes = load(tmp_path, env=env)
    assert config.max_batch_delay_ms == 7
    assert config.disable_token_authorization is True
    assert config.limit_max_image_pixels is False
    assert config.allowed_urls == [r"https://models\.example\.com/.*", "file:///srv/.*"]
    assert config.load_all and config.model_specs() == []
    assert notes == ["ignored unknown environment variable TORCHBAY_MODLE_STORE"]


def test_unknown_cli_key_is_a_programming_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no_such_flag"):
        load(tmp_path, cli={"no_such_flag": 1})


def test_metrics_mode_is_used_not_noted(tmp_path: Path) -> None:
    config, notes = load(tmp_path, cli={"metrics_mode": "LOG"})
    assert config.metrics_mode == "log"  # observe.ts_families writes TorchServe's log lines
    assert not any("metrics_mode" in n for n in notes)


@pytest.mark.parametrize(
    ("cli", "field"),
    [
        ({"job_queue_size": 0}, "job_queue_size"),
        ({"inference_address": "localhost:8080"}, "inference_address"),
        ({"management_address": "https://127.0.0.1:8443"}, "private_key_file"),
        ({"allowed_urls": "https://(unclosed"}, "allowed_urls"),
        ({"batch_size": "eight"}, "batch_size"),
        ({"metrics_mode": "statsd"}, "metrics_mode"),
        ({"load_models": "=x.mar"}, "load_models"),
    ],
)
def test_validation_errors_name_the_problem(tmp_path: Path, cli: dict, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        load(tmp_path, cli=cli)
    assert field in str(info.value)


def test_tls_with_key_and_certificate(tmp_path: Path) -> None:
    config, _ = load(
        tmp_path,
        cli={
            "inference_address": "https://[::1]:8443",
            "private_key_file": "key.pem",
            "certificate_file": "cert.pem",
        },
    )
    assert config.inference.tls and config.inference.host == "::1"
    assert config.private_key_file == tmp_path / "key.pem"


def test_bad_models_json_is_a_config_error(tmp_path: Path) -> None:
    path = write(tmp_path / "c.properties", "models={not json\n")
    with pytest.raises(ConfigError, match="models="):
        load(tmp_path, ts_config=path)


def test_models_entry_max_below_min_is_rejected(tmp_path: Path) -> None:
    path = write(
        tmp_path / "c.properties", 'models={"m": {"1.0": {"minWorkers": 3, "maxWorkers": 1}}}\n'
    )
    with pytest.raises(ValidationError, match="max_workers"):
        load(tmp_path, ts_config=path)


def test_model_spec_with_url() -> None:
    config = ServerConfig(load_models=["m=https://host/x.mar?sig=abc", "https://host/y.mar?a=b"])
    assert config.model_specs() == [
        ModelSpec(name="m", url="https://host/x.mar?sig=abc"),
        ModelSpec(name=None, url="https://host/y.mar?a=b"),
    ]


def test_restart_delay_caps_at_last() -> None:
    config = ServerConfig(restart_backoff_s=(0, 1, 5))
    assert [config.restart_delay_s(i) for i in range(5)] == [0, 1, 5, 5, 5]


# ----------------------------------------------------------------------------- model config
def test_model_config_camel_case_and_snake_case() -> None:
    a = ModelConfig.model_validate(
        {
            "minWorkers": 2,
            "batchSize": 4,
            "deviceType": "GPU",
            "deviceIds": [1, 0],
            "clientTimeoutInMills": 500,
        }
    )
    b = ModelConfig(
        min_workers=2, batch_size=4, device_type="gpu", device_ids=[1, 0], client_timeout_ms=500
    )
    assert a == b
    assert a.max_workers == 2  # defaults to min_workers
    assert "max_workers" not in a.model_fields_set


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"minWorkers": 3, "maxWorkers": 2}, "max_workers"),
        ({"batchSize": 0}, "batchSize"),
        ({"maxBatchDelay": -1}, "maxBatchDelay"),
        ({"deviceType": "neuron"}, "not supported"),
        ({"deviceType": "tpu"}, "deviceType"),
        ({"deviceIds": [-1]}, "device ids"),
        ({"deviceIds": 1}, "deviceIds must be a list"),  # was a TypeError: a 500 at register
        ({"deviceIds": 1.5}, "deviceIds must be a list"),
        ({"deviceIds": True}, "deviceIds must be a list"),
        ({"noSuchKey": 1}, "noSuchKey"),
    ],
)
def test_model_config_validation(raw: dict, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        ModelConfig.model_validate(raw)


def _server(tmp_path: Path) -> ServerConfig:
    path = write(
        tmp_path / "c.properties",
        "default_workers_per_model=1\nbatch_size=2\nmax_batch_delay=10\n"
        "default_response_timeout=60\njob_queue_size=50\n"
        'models={"m": {"1.0": {"batchSize": 4, "responseTimeout": 30, "minWorkers": 2}}}\n',
    )
    return load(tmp_path, ts_config=path)[0]


def test_resolve_defaults_from_server(tmp_path: Path) -> None:
    server = _server(tmp_path)
    cfg = resolve_model_config(
        server, name="other", version="1.0", archive_yaml=None, api_overrides=None
    )
    assert (cfg.min_workers, cfg.max_workers, cfg.batch_size) == (1, 1, 2)
    assert (cfg.max_batch_delay_ms, cfg.response_timeout_s, cfg.job_queue_size) == (10, 60, 50)


def test_resolve_precedence_models_entry_yaml_api(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = _server(tmp_path)
    entry = resolve_model_config(
        server, name="m", version="1.0", archive_yaml=None, api_overrides=None
    )
    assert (entry.batch_size, entry.response_timeout_s, entry.max_batch_delay_ms) == (4, 30, 10)
    assert (entry.min_workers, entry.max_workers) == (2, 2)  # raising min raised max

    yaml = {
        "batchSize": 8,
        "maxWorkers": 6,
        "deviceType": "cpu",
        "parallelType": "tp",
        "torchrun": {"nproc-per-node": 4},
        "handler": {"model_path": "weights"},
        "pt2": {"compile": {"enable": True}},
    }
    with caplog.at_level(logging.INFO, logger="torchbay.server.config"):
        cfg = resolve_model_config(
            server, name="m", version="1.0", archive_yaml=yaml, api_overrides=None
        )
    assert (cfg.batch_size, cfg.response_timeout_s, cfg.max_workers) == (8, 30, 6)
    assert cfg.device_type == "cpu" and cfg.handler is None
    assert cfg.handler_config == {
        "handler": {"model_path": "weights"},
        "pt2": {"compile": {"enable": True}},
    }
    assert "parallelType" in caplog.text and "torchrun" in caplog.text

    api = {"batch_size": "16", "max_batch_delay": "5", "initial_workers": "7", "handler": "h.py"}
    cfg = resolve_model_config(
        server, name="m", version="1.0", archive_yaml=yaml, api_overrides=api
    )
    assert (cfg.batch_size, cfg.max_batch_delay_ms, cfg.handler) == (16, 5, "h.py")
    assert (cfg.min_workers, cfg.max_workers) == (7, 7)  # initial_workers above yaml's max
    assert cfg.handler_config["pt2"] == {"compile": {"enable": True}}


def test_resolve_scale_parameters(tmp_path: Path) -> None:
    server = _server(tmp_path)
    cfg = resolve_model_config(
        server,
        name="x",
        version="1",
        archive_yaml=None,
        api_overrides={"min_worker": 1, "max_worker": 3},
    )
    assert (cfg.min_workers, cfg.max_workers) == (1, 3)
    with pytest.raises(ValidationError, match="max_workers"):
        resolve_model_config(
            server,
            name="x",
            version="1",
            archive_yaml=None,
            api_overrides={"min_worker": 3, "max_worker": 1},
        )
    with pytest.raises(ConfigError, match="url"):
        resolve_model_config(
            server, name="x", version="1", archive_yaml=None, api_overrides={"url": "x.mar"}
        )


def test_resolve_server_cpu_settings(tmp_path: Path) -> None:
    server, _ = load(tmp_path, cli={"cpu_threads_per_worker": 2, "cpu_affinity": True})
    cfg = resolve_model_config(
        server, name="x", version="1", archive_yaml={"minWorkers": 0}, api_overrides=None
    )
    assert (cfg.cpu_threads, cfg.cpu_affinity, cfg.min_workers, cfg.max_workers) == (2, True, 0, 1)


@pytest.mark.parametrize(
    ("model", "settings"),
    [
        (ModelConfig, {"min_workers": 10**12}),
        (ModelConfig, {"max_batch_delay_ms": float("inf")}),
        (ModelConfig, {"max_batch_delay_ms": float("nan")}),
        (ModelConfig, {"batch_size": 10**9}),
        (ModelConfig, {"response_timeout_s": 1e300}),
        (ModelConfig, {"device_ids": [1 << 40]}),
        (ServerConfig, {"job_queue_size": 10**12}),
        (ServerConfig, {"max_request_size": 1 << 40}),
        (ServerConfig, {"restart_backoff_s": (float("inf"),)}),
        (ServerConfig, {"max_archive_compression_ratio": float("inf")}),
        (ServerConfig, {"http_header_timeout_s": 0}),
    ],
)
def test_every_numeric_setting_is_bounded(model: type, settings: dict) -> None:
    with pytest.raises(ValidationError):
        model(**settings)


def test_bounds_apply_to_config_properties_too(tmp_path: Path) -> None:
    # From the file, an out-of-bounds value warns and keeps the default (config/lenient.py);
    # the same value typed as a flag or an environment variable is refused.
    path = write(tmp_path / "c.properties", "max_batch_delay=inf\n")
    config, notes = load(tmp_path, ts_config=path, env={}, cli={})
    assert config.max_batch_delay_ms == 100.0
    assert any("malformed value 'inf' for max_batch_delay_ms" in n for n in notes)
    with pytest.raises(ValidationError, match="finite"):
        load(tmp_path, ts_config=None, env={}, cli={"max_batch_delay": "inf"})
    with pytest.raises(ValidationError, match="finite"):
        load(tmp_path, ts_config=None, env={"TORCHBAY_MAX_BATCH_DELAY": "inf"}, cli={})


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), 1e400])
def test_an_infinite_worker_count_in_model_config_is_the_settings_error(
    tmp_path: Path, value: float
) -> None:
    """``minWorkers: .inf`` in model-config.yaml (YAML's infinity) raised OverflowError while
    max was raised to min (a 500 at registration, hunt-time saw it); it is now the settings'
    error that names the field."""
    with pytest.raises(ValidationError, match="min_workers"):
        resolve_model_config(
            _server(tmp_path),
            name="m",
            version="1.0",
            archive_yaml={"minWorkers": value},
            api_overrides=None,
        )


def test_a_file_that_is_not_utf_8_is_read_as_latin_1_as_java_reads_it(tmp_path: Path) -> None:
    """java.util.Properties.load(InputStream) reads ISO 8859-1, so TorchServe starts on a file
    with a Latin-1 comment. Was: "cannot read config file ... 'utf-8' codec can't decode",
    and the server did not start."""
    path = tmp_path / "config.properties"
    path.write_bytes(b"# Mod\xe8le de production\njob_queue_size=7\nmodel_store=/caf\xe9\n")
    config, _ = load(tmp_path, ts_config=path)
    assert config.job_queue_size == 7
    assert config.model_store == Path("/caf\u00e9")
    path.write_bytes("model_store=/caf\u00e9\n".encode())  # UTF-8 stays UTF-8 (Java: "cafÃ©")
    config, _ = load(tmp_path, ts_config=path)
    assert config.model_store == Path("/caf\u00e9")


def test_models_json_is_read_as_leniently_as_torchserve_s_gson_reads_it(tmp_path: Path) -> None:
    """TorchServe reads models= (and model_snapshot) with Gson's lenient fromJson: single
    quotes, unquoted names, comments, ``;``. Was: "models= is not valid JSON", and the server
    did not start."""
    text = (
        "models={'noop': {'1.0': {marName: 'noop.mar', /* two */ minWorkers: 2;\\\n"
        "  'batchSize': 4}}}\n"
        "model_snapshot={'name': 'startup.cfg', 'models': {'other': {'2.0': {marName: o.mar}}}}\n"
    )
    config, _ = load(tmp_path, ts_config=write(tmp_path / "config.properties", text))
    entry = config.models["noop"]["1.0"]
    assert (entry.mar_name, entry.min_workers, entry.batch_size) == ("noop.mar", 2, 4)
    assert config.models["other"]["2.0"].mar_name == "o.mar"
    config, _ = load(tmp_path, ts_config=write(tmp_path / "config.properties", "models=\n"))
    assert config.models == {}
    with pytest.raises(ConfigError, match="not valid JSON"):  # as Gson: no trailing comma
        load(tmp_path, ts_config=write(tmp_path / "config.properties", 'models={"a": {},}\n'))
