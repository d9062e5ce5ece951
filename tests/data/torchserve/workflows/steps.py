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
INF, M = "inference", "management"


def step(step_id, listener, method, path, **options):
    """One step as record.py and the test read it (``options``: ``json``, the body)."""
    return {"id": step_id, "listener": listener, "method": method, "path": path, **options}


STEPS = [
    step("list_empty", M, "GET", "/workflows"),
    step("register_arith", M, "POST", "/workflows?url=arith.war"),
    step("register_split", M, "POST", "/workflows?url=split.war&workflow_name=split"),
    step("register_again", M, "POST", "/workflows?url=arith.war"),
    step("register_no_url", M, "POST", "/workflows"),
    step("register_missing", M, "POST", "/workflows?url=nowhere.war"),
    step("register_relative", M, "POST", "/workflows?url=../arith.war"),
    step("register_cycle", M, "POST", "/workflows?url=cycle.war"),
    step("register_missing_model", M, "POST", "/workflows?url=missing_model.war"),
    step("list", M, "GET", "/workflows"),
    step("list_limit", M, "GET", "/workflows?limit=1"),
    step("describe", M, "GET", "/workflows/arith"),
    step("describe_unknown", M, "GET", "/workflows/nope"),
    step("models", M, "GET", "/models"),
    step("describe_node", M, "GET", "/models/arith__square"),
    step("predict", INF, "POST", "/wfpredict/arith", json=VALUES),
    step("predict_split", INF, "POST", "/wfpredict/split", json=VALUES),
    step(
        "predict_fail_start",
        INF,
        "POST",
        "/wfpredict/arith",
        json={"values": [1], "fail": "pre_processing"},
    ),
    step(
        "predict_fail_model",
        INF,
        "POST",
        "/wfpredict/arith",
        json={"values": [1], "fail": "square"},
    ),
    step("predict_unknown", INF, "POST", "/wfpredict/nope", json=VALUES),
    step("predict_node_model", INF, "POST", "/predictions/arith__double", json=VALUES),
    # the method: TorchServe's own docs upload with curl -T, a PUT
    step("predict_put", INF, "PUT", "/wfpredict/arith", json=VALUES),
    step("predict_get", INF, "GET", "/wfpredict/arith", json=VALUES),
    # any other method runs it too: TorchServe checks no method
    step("predict_delete", INF, "DELETE", "/wfpredict/arith", json=VALUES),
    step("predict_patch", INF, "PATCH", "/wfpredict/arith", json=VALUES),
    # TorchServe takes a trailing slash and ignores further segments, as for /predictions
    step("predict_trailing_slash", INF, "POST", "/wfpredict/arith/", json=VALUES),
    step("predict_more_segments", INF, "POST", "/wfpredict/arith/more/path", json=VALUES),
    step("predict_node_model_put", INF, "PUT", "/predictions/arith__double", json=VALUES),
    step("predict_node_model_get", INF, "GET", "/predictions/arith__double", json=VALUES),
    step("scale_workflow", M, "PUT", "/workflows/arith"),
    step("unregister_split", M, "DELETE", "/workflows/split"),
    step("unregister_arith", M, "DELETE", "/workflows/arith"),
    step("unregister_unknown", M, "DELETE", "/workflows/arith"),
    step("models_after", M, "GET", "/models"),
    step("list_after", M, "GET", "/workflows"),
]
