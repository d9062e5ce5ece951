"""The workflow calls recorded against TorchServe 0.12 (record.py) and replayed against torchbay
(tests/server/test_workflow_parity.py), in order. Each step: an id, the listener, the method, the
path, an optional JSON body (sent as application/json)."""

ARCHIVES = {  # model store: file name -> model name
    "double.mar": "double",
    "square.mar": "square",
}
WORKFLOWS = {  # workflow store: file name -> spec file (the handler is workflow_handler.py)
    "arith.war": "arith.yaml",
    "split.war": "split.yaml",
    "cycle.war": "cycle.yaml",
    "missing_model.war": "missing_model.yaml",
}
VALUES = {"values": [1, 2, 3]}

STEPS = [
    {"id": "list_empty", "listener": "management", "method": "GET", "path": "/workflows"},
    {"id": "register_arith", "listener": "management", "method": "POST",
     "path": "/workflows?url=arith.war"},
    {"id": "register_split", "listener": "management", "method": "POST",
     "path": "/workflows?url=split.war&workflow_name=split"},
    {"id": "register_again", "listener": "management", "method": "POST",
     "path": "/workflows?url=arith.war"},
    {"id": "register_no_url", "listener": "management", "method": "POST", "path": "/workflows"},
    {"id": "register_missing", "listener": "management", "method": "POST",
     "path": "/workflows?url=nowhere.war"},
    {"id": "register_relative", "listener": "management", "method": "POST",
     "path": "/workflows?url=../arith.war"},
    {"id": "register_cycle", "listener": "management", "method": "POST",
     "path": "/workflows?url=cycle.war"},
    {"id": "register_missing_model", "listener": "management", "method": "POST",
     "path": "/workflows?url=missing_model.war"},
    {"id": "list", "listener": "management", "method": "GET", "path": "/workflows"},
    {"id": "list_limit", "listener": "management", "method": "GET", "path": "/workflows?limit=1"},
    {"id": "describe", "listener": "management", "method": "GET", "path": "/workflows/arith"},
    {"id": "describe_unknown", "listener": "management", "method": "GET",
     "path": "/workflows/nope"},
    {"id": "models", "listener": "management", "method": "GET", "path": "/models"},
    {"id": "describe_node", "listener": "management", "method": "GET",
     "path": "/models/arith__square"},
    {"id": "predict", "listener": "inference", "method": "POST", "path": "/wfpredict/arith",
     "json": VALUES},
    {"id": "predict_split", "listener": "inference", "method": "POST", "path": "/wfpredict/split",
     "json": VALUES},
    {"id": "predict_fail_start", "listener": "inference", "method": "POST",
     "path": "/wfpredict/arith", "json": {"values": [1], "fail": "pre_processing"}},
    {"id": "predict_fail_model", "listener": "inference", "method": "POST",
     "path": "/wfpredict/arith", "json": {"values": [1], "fail": "square"}},
    {"id": "predict_unknown", "listener": "inference", "method": "POST",
     "path": "/wfpredict/nope", "json": VALUES},
    {"id": "predict_node_model", "listener": "inference", "method": "POST",
     "path": "/predictions/arith__double", "json": VALUES},
    {"id": "scale_workflow", "listener": "management", "method": "PUT",
     "path": "/workflows/arith"},
    {"id": "unregister_split", "listener": "management", "method": "DELETE",
     "path": "/workflows/split"},
    {"id": "unregister_arith", "listener": "management", "method": "DELETE",
     "path": "/workflows/arith"},
    {"id": "unregister_unknown", "listener": "management", "method": "DELETE",
     "path": "/workflows/arith"},
    {"id": "models_after", "listener": "management", "method": "GET", "path": "/models"},
    {"id": "list_after", "listener": "management", "method": "GET", "path": "/workflows"},
]  # fmt: skip
