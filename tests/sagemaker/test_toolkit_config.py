"""The configuration SageMaker's PyTorch toolkit writes, read by torchbay: its flaws warn and
keep TorchServe's defaults instead of refusing the file (server/config/lenient.py), and a
malformed value of a key where the default is not the safe reading still refuses it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.sagemaker.helpers import toolkit_config
from torchbay.server.config.sources import load_server_config


def load(tmp_path: Path, text: str):
    path = tmp_path / "sagemaker-ts.properties"
    path.write_text(text, encoding="utf-8")
    return load_server_config(ts_config=path, env={}, cli={}, cwd=tmp_path)


def test_the_toolkits_file_loads_with_a_warning_for_its_run_on_line(tmp_path: Path) -> None:
    text = toolkit_config(18080)
    # The flaw: the packaged defaults lack a final newline, so two keys share one line.
    assert "enable_model_api=truedefault_response_timeout=60\n" in text
    config, notes = load(tmp_path, text)
    warnings = [n for n in notes if n.startswith("WARNING ")]
    assert len(warnings) == 1
    # (Java's Boolean.parseBoolean: anything but "true" is false, config/ts_values.py)
    assert "enable_model_api='truedefault_response_timeout=60' reads as false" in warnings[0]
    # TorchServe 0.12 reads the line as "Model API enabled: false" too (answers.json), and the
    # response timeout the toolkit meant (60) is lost in both: TorchServe's default stays.
    assert config.enable_model_api is False
    assert config.default_response_timeout_s == 120.0
    assert config.inference_address == config.management_address == "http://0.0.0.0:18080"
    assert config.default_service_handler is not None
    assert config.default_service_handler.endswith(
        "sagemaker_pytorch_serving_container/handler_service.py:handle"
    )
    assert config.decode_input_request is False
    assert config.disable_token_authorization is True
    assert config.load_all  # load_models=ALL: the (empty) model store
    assert any("ignored TorchServe key 'vmargs'" in n for n in notes)


def test_the_toolkits_models_json_from_sagemaker_ts_variables(tmp_path: Path) -> None:
    # SAGEMAKER_TS_* set: the toolkit adds models={...} over backslash-continued lines.
    text = toolkit_config(18080, SAGEMAKER_TS_BATCH_SIZE="4", SAGEMAKER_TS_MAX_BATCH_DELAY="7")
    config, _ = load(tmp_path, text)
    entry = config.models["model"]["1.0"]
    assert (entry.batch_size, entry.max_batch_delay_ms, entry.mar_name) == (4, 7.0, "model.mar")
    assert entry.default_version is True


def test_malformed_values_with_a_cautious_default_are_forgiven(tmp_path: Path) -> None:
    config, notes = load(
        tmp_path,
        "disable_token_authorization=yes please\njob_queue_size=lots\nbatch_size=8\n",
    )
    assert config.disable_token_authorization is False  # the API keys stay on
    assert config.job_queue_size == 100
    assert config.batch_size == 8  # the good line is kept
    assert sum(n.startswith("WARNING ") for n in notes) == 2


@pytest.mark.parametrize(
    "line",
    [
        "inference_address=http://127.0.0.1:eighty",
        "management_address=0.0.0.0",
        "allowed_urls=file://(.*",
        "grpc_inference_port=seventy",
        "enable_grpc_ssl=maybe",
    ],
)
def test_malformed_values_where_the_default_is_unsafe_refuse_the_file(
    tmp_path: Path, line: str
) -> None:
    with pytest.raises(ValidationError):
        load(tmp_path, f"job_queue_size=lots\n{line}\n")
