"""config/gson_json.py against what Gson answered: each case's expectation is the output of
TorchServe 0.12's own Gson (``Gson.fromJson(text, Map<String, Map<String, JsonObject>>)``,
model-server.jar from /work/ts-venv, Java 17), ``None`` where it threw."""

from __future__ import annotations

import pytest

from torchbay.server.config.gson_json import loads

NULL = object()  # Gson's null (None stands for "threw")
ENTRY = {"m": {"1.0": {"marName": "m.mar", "minWorkers": 1}}}
CASES = [
    ("{'m': {'1.0': {'marName': 'm.mar', 'minWorkers': 1}}}", ENTRY),
    ('{m: {"1.0": {marName: m.mar, minWorkers: 1}}}', ENTRY),
    ('{"m": {"1.0": {"marName": "m.mar", "minWorkers": 1,}}}', None),  # "Expected name"
    ('{"m": {"1.0": {"marName": "m.mar", /* c */ "minWorkers": 1}}}', ENTRY),
    ('{"m": {"1.0": {"marName": "m.mar"; "minWorkers": 1}}}', ENTRY),
    ('{"m": {"1.0": {"marName" = "m.mar", "minWorkers" => 1}}}', ENTRY),
    ('{"m": {"1.0": {"marName": "m.mar", # c\n "minWorkers": 1}}}', ENTRY),
    ('{"m": {"1.0": {"marName": "m.mar", // c\n "minWorkers": 1}}}', ENTRY),
    ('{"m": {"1.0": {"marName": "m.mar"}}} x', None),  # not fully consumed
    ("", NULL),  # an empty document
    ('{"m": {"1.0": {"marName": m.mar minWorkers: 1}}}', None),  # "Unterminated object"
    (
        "{'m': {'1.0': {'marName': 'a\\u00e9', 'l': [1;2]}}}",
        {"m": {"1.0": {"marName": "aé", "l": [1, 2]}}},
    ),
    ('{"m": {"1.0": {"batchSize": 08}}}', {"m": {"1.0": {"batchSize": "08"}}}),
    ('{"m": {"1.0": {"batchSize": -3, "b": 1e3}}}', {"m": {"1.0": {"batchSize": -3, "b": 1000.0}}}),
]


@pytest.mark.parametrize(("text", "gson"), CASES)
def test_read_as_gson_reads_it(text: str, gson: object) -> None:
    if gson is None:
        with pytest.raises(ValueError):
            loads(text)
    elif gson is NULL:
        assert loads(text) is None
    else:
        assert loads(text) == gson
