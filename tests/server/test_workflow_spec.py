"""A workflow's spec and DAG read as TorchServe 0.12 reads them (server/workflows/spec.py), and a
``.war``'s location and unpacking (server/workflows/archive.py). No server."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import yaml

from torchbay.server.config.settings import ServerConfig
from torchbay.server.errors import BadRequest
from torchbay.server.workflows.archive import (
    InvalidWorkflow,
    WorkflowNotFound,
    function_folder,
    unpack,
    war_path,
)
from torchbay.server.workflows.spec import InvalidDag, parse_spec

ARITH = Path(__file__).resolve().parents[1] / "data" / "torchserve" / "workflows" / "arith.yaml"


def spec(text: str):
    return parse_spec(yaml.safe_load(text))


def test_model_and_function_nodes_get_torchserves_settings() -> None:
    parsed = parse_spec(yaml.safe_load(ARITH.read_text()))
    assert list(parsed.nodes) == ["pre_processing", "double", "square", "aggregate"]
    assert parsed.start == "pre_processing" and parsed.leaves() == ["aggregate"]
    assert parsed.parents["aggregate"] == ["double", "square"]
    square = parsed.nodes["square"]
    assert square.url == "square.mar"
    assert square.settings == {
        "min-workers": 1, "max-workers": 1, "batch-size": 2, "max-batch-delay": 20,
        "retry-attempts": 1, "timeout-ms": 10000,
    }  # fmt: skip
    function = parsed.nodes["aggregate"]
    assert function.is_function
    assert function.settings["batch-size"] == 1 and function.settings["max-batch-delay"] == 0
    assert parsed.dag_text == (
        "{pre_processing=[double, square], double=[aggregate], square=[aggregate]}"
    )


def test_a_global_applies_to_the_models_after_it() -> None:
    parsed = spec(
        "models:\n  a:\n    url: a.mar\n  batch-size: 4\n  b:\n    url: b.mar\ndag:\n  a: [b]\n"
    )
    assert parsed.nodes["a"].settings["batch-size"] == 1
    assert parsed.nodes["b"].settings["batch-size"] == 4
    assert parsed.globals["batch-size"] == 4


@pytest.mark.parametrize(
    ("dag", "message"),
    [
        ("a: [a]", "Self loop exception"),
        ("a: [b, b]", "loop exception"),  # TorchServe's name for a repeated edge
        ("a: [c]\nb: [c]", "DAG should have only one start node"),
        ("s: [a]\na: [b]\nb: [a]", "Not a valid DAG"),
    ],
)
def test_a_bad_dag_is_refused_in_torchserves_words(dag: str, message: str) -> None:
    with pytest.raises(InvalidDag) as caught:
        spec("models: {}\ndag:\n  " + dag.replace("\n", "\n  "))
    assert caught.value.message == message
    assert caught.value.status == 400 and caught.value.type == "InvalidDAGException"


@pytest.mark.parametrize(
    "text",
    [
        "models:\n  batch-size: two\ndag:\n  a: []\n",
        "models:\n  m: {}\ndag:\n  m: []\n",
        "models: {}\ndag: []\n",
        "- not a mapping\n",
        "models: {}\ndag:\n  a: b\n",
    ],
)
def test_a_malformed_spec_is_a_400(text: str) -> None:
    with pytest.raises(BadRequest) as caught:
        spec(text)
    assert caught.value.status == 400
    assert "Invalid workflow specification" in caught.value.message


def test_a_model_nodes_settings_below_their_bound_are_the_default() -> None:
    """TorchServe registers these (a batch size of 0, -1 workers); they were a 500 'Check error
    logs.' from the node's registration (the model's config refused them)."""
    parsed = spec(
        "models:\n  batch-size: 0\n  min-workers: -1\n  max-workers: -3\n"
        "  max-batch-delay: -5\n  a:\n    url: a.mar\n  b:\n    url: b.mar\n"
        "    min-workers: 2\n    max-workers: 1\ndag:\n  a: [b]\n"
    )
    defaults = {"min-workers": 1, "max-workers": 1, "batch-size": 1, "max-batch-delay": 50}
    assert parsed.nodes["a"].settings == {**defaults, "retry-attempts": 1, "timeout-ms": 10000}
    assert parsed.nodes["b"].settings["min-workers"] == 2
    assert parsed.nodes["b"].settings["max-workers"] == 2
    assert parsed.globals["batch-size"] == 0  # describe shows the spec's own, as TorchServe


@pytest.mark.parametrize(
    ("key", "api"), [("max-workers", "max_worker"), ("batch-size", "batch_size")]
)
def test_a_model_nodes_setting_past_its_bound_is_a_400_naming_it(key: str, api: str) -> None:
    with pytest.raises(BadRequest) as caught:
        spec(f"models:\n  {key}: 100000000\n  a:\n    url: a.mar\ndag:\n  a: []\n")
    assert caught.value.status == 400
    assert caught.value.message.startswith("Invalid workflow specification: model 'a': ")
    assert api in caught.value.message


@pytest.mark.parametrize(
    ("models", "where", "value"),
    [
        ("  timeout-ms: 0\n  a:\n    url: a.mar\n", "models", 0),
        ("  timeout-ms: -5\n  a:\n    url: a.mar\n", "models", -5),
        ("  a:\n    url: a.mar\n    timeout-ms: 0\n", "model 'a'", 0),
    ],
)
def test_a_timeout_of_zero_or_below_is_a_400(models: str, where: str, value: int) -> None:
    """TorchServe 0.12 fails every node of such a workflow at once (``Timed out while executing
    pre_processing``, tests/data/torchserve/workflow_timeout); torchbay ran its nodes with no
    timeout. Refused when the spec is read, as the other bad settings are."""
    with pytest.raises(BadRequest) as caught:
        spec(f"models:\n{models}dag:\n  a: []\n")
    assert caught.value.status == 400
    assert caught.value.message == (
        f"Invalid workflow specification: {where} timeout-ms must be above 0, got {value}"
    )


def test_a_war_url_stays_inside_the_store(tmp_path: Path) -> None:
    (tmp_path / "w.war").write_bytes(b"")
    assert war_path(tmp_path, "w.war") == (tmp_path / "w.war").resolve()
    for url, message in [
        ("../w.war", "Relative path is not allowed in url: ../w.war"),
        ("/etc/passwd", "Workflow not found in workflow store: /etc/passwd"),
        ("nope.war", "Workflow not found in workflow store: nope.war"),
    ]:
        with pytest.raises(WorkflowNotFound) as caught:
            war_path(tmp_path, url)
        assert caught.value.message == message and caught.value.status == 404
    with pytest.raises(WorkflowNotFound, match=r"Workflow store has not been configured\."):
        war_path(None, "w.war")


def _war(path: Path, manifest: dict | str, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as war:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        war.writestr("WAR-INF/MANIFEST.json", text)
        for name, text in files.items():
            war.writestr(name, text)
    return path


BILLION_LAUGHS = "\n".join(
    ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 8)]
    + ["models: {}", "dag:", "  start: *a7", ""]
)
GOOD = {
    "createdOn": "01/01/2025 00:00:00",
    "archiverVersion": "0.2.15",
    "workflow": {"workflowName": "w", "specFile": "w.yaml", "handler": "h.py"},
}


def test_a_war_unpacks_and_a_function_node_gets_its_own_model_folder(tmp_path: Path) -> None:
    war = _war(tmp_path / "w.war", GOOD, {"w.yaml": "dag:\n  f: []\n", "h.py": "def f(d, c): pass"})
    unpacked = unpack(war, tmp_path / "out", ServerConfig(), "renamed")
    assert unpacked.name == "renamed" and unpacked.handler == "h.py"
    assert unpacked.spec == {"dag": {"f": []}}
    folder = function_folder(unpacked, "f", "renamed__f", tmp_path / "node")
    manifest = json.loads((folder / "MAR-INF" / "MANIFEST.json").read_text())
    assert manifest["model"]["handler"] == "h.py:f"
    assert manifest["model"]["modelName"] == "renamed__f"
    assert (folder / "h.py").is_file() and not (folder / "WAR-INF").exists()


@pytest.mark.parametrize(
    ("manifest", "files", "message"),
    [
        ({}, {}, "Missing Workflow entry in manifest file."),
        ({**GOOD, "archiverVersion": None}, {}, "Workflow archive version is not defined."),
        (GOOD, {"h.py": ""}, "The workflow archive's spec file w.yaml is missing."),
        (GOOD, {"w.yaml": "a: [", "h.py": ""}, "Failed to parse yaml."),
        (GOOD, {"w.yaml": "[" * 100_000, "h.py": ""}, "Failed to parse yaml."),  # too deep
        ("[" * 100_000, {}, "nested too deep"),
        (GOOD, {"../x.py": ""}, "../x.py"),
        # 1 KB of nested aliases: 10**8 values once expanded; reading it blocked the server
        (GOOD, {"w.yaml": BILLION_LAUGHS, "h.py": ""}, "more than 100000 values"),
    ],
)
def test_a_bad_war_is_a_400_and_leaves_nothing(
    tmp_path: Path, manifest: dict | str, files: dict[str, str], message: str
) -> None:
    war = _war(tmp_path / "w.war", manifest, files)
    with pytest.raises(InvalidWorkflow) as caught:
        unpack(war, tmp_path / "out", ServerConfig(), None)
    assert message in caught.value.message and caught.value.status == 400
    assert str(tmp_path) not in caught.value.message
    assert not (tmp_path / "out").exists()


def test_a_spec_may_share_settings_through_yaml_aliases(tmp_path: Path) -> None:
    spec_text = (
        "shared: &shared {batch-size: 4, url: m.mar}\n"
        "models:\n  m: *shared\n  n: {<<: *shared, url: n.mar}\ndag:\n  m: [n]\n"
    )
    war = _war(tmp_path / "w.war", GOOD, {"w.yaml": spec_text, "h.py": ""})
    parsed = parse_spec(unpack(war, tmp_path / "out", ServerConfig(), None).spec)
    assert parsed.nodes["n"].url == "n.mar" and parsed.nodes["n"].settings["batch-size"] == 4


def test_the_workflow_store_and_start_up_workflows_come_from_properties_and_flags(
    tmp_path: Path,
) -> None:
    import argparse

    from torchbay.server.cli import _cli_settings, register
    from torchbay.server.config.sources import load_server_config

    (tmp_path / "config.properties").write_text(
        "workflow_store=wars\nload_workflows=a.war,b=b.war\n"
    )
    config, _ = load_server_config(ts_config=None, env={}, cli={}, cwd=tmp_path)
    assert config.workflow_store == (tmp_path / "wars").resolve()
    assert config.load_workflows == ["a.war", "b=b.war"]
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "--workflow-store", "w", "--workflows", "all"])
    settings = _cli_settings(args)
    assert settings["workflow_store"] == "w" and settings["load_workflows"] == ["all"]
