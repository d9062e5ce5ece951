"""The raw listeners' route tables: dispatch and OpenAPI document come from the same table, so
every table entry is documented, every documented operation dispatches to its entry, and the
path parameters reach the endpoint."""

from __future__ import annotations

from typing import Any

import pytest

from torchbay.server.errors import MethodNotAllowed, NotFound, Unauthorized
from torchbay.server.http.inference import InferenceApp
from torchbay.server.http.openapi import inference_openapi, metrics_openapi
from torchbay.server.http.route_table import INFERENCE_ROUTES, METRICS_ROUTES
from torchbay.server.http.routes import Route, Router
from torchbay.server.plane import DataPlane

from .test_openapi import _call, _registry

METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")
TABLES = [
    pytest.param(INFERENCE_ROUTES, inference_openapi, id="inference"),
    pytest.param(METRICS_ROUTES, metrics_openapi, id="metrics"),
]


def _router(routes: tuple[Route, ...]) -> Router:
    async def endpoint(*args: object) -> None:  # never called here
        raise AssertionError

    return Router(routes, {r.endpoint: endpoint for r in routes}, oip_prefix="/v2")


def _fill(route: Route) -> tuple[str, dict[str, str]]:
    values = {name: f"{name[:1]}-{i}.x" for i, name in enumerate(route.params())}
    path = route.path
    for name, value in values.items():
        path = path.replace("{" + name + "}", value)
    return path, values


@pytest.mark.parametrize(("routes", "document"), TABLES)
def test_every_table_entry_is_documented_and_nothing_else(routes, document):
    doc = document("t")
    documented = {
        (path, method.upper())
        for path, item in doc["paths"].items()
        for method in item
        if method.upper() in METHODS
    }
    table = {(r.path, r.method) for r in routes}
    assert len(table) == len(routes), "a (method, path) appears twice in the table"
    assert documented == table
    for route in routes:
        op = doc["paths"][route.path][route.method.lower()]
        assert op["summary"] == route.summary
        for code in (*route.errors, *route.answers):
            assert str(code) in op["responses"], (route.method, route.path, code)
        assert ("security" in op) == route.auth
        names = [p["name"] for p in op.get("parameters", ()) if p["in"] == "path"]
        assert names == route.params()


@pytest.mark.parametrize(("routes", "document"), TABLES)
def test_every_documented_operation_dispatches_to_its_entry(routes, document):
    router = _router(routes)
    doc = document("t")
    by_key = {(r.path, r.method): r for r in routes}
    for route in routes:
        path, values = _fill(route)
        found, _endpoint, match = router.resolve(path, route.method)
        assert found is route, (route.method, route.path, found)
        for name, value in values.items():
            assert match[name] == value
        assert (found.path, found.method) in by_key
        assert found.method.lower() in doc["paths"][found.path]
        # Another method on the same path: its any_method route (TorchServe's routes check no
        # method), else 405 where the route says so, else 404.
        anyone = [r for r in routes if r.path == route.path and r.any_method]
        for method in METHODS:
            if (route.path, method) in by_key:
                continue
            if anyone:
                assert router.resolve(path, method)[0] is anyone[0], (method, route.path)
                continue
            expected = MethodNotAllowed if route.strict else NotFound
            with pytest.raises(expected):
                router.resolve(path, method)


def test_oip_routes_are_the_v2_ones_and_suffix_routes_take_more_segments():
    router = _router(INFERENCE_ROUTES)
    for route in INFERENCE_ROUTES:
        assert route.oip == route.path.startswith("/v2"), route.path
    suffixed = [r for r in INFERENCE_ROUTES if r.suffix]
    assert {r.path for r in suffixed} == {
        "/predictions/{model_name}/{model_version}",
        "/explanations/{model_name}/{model_version}",
        "/wfpredict/{workflow_name}",  # taken and ignored, as TorchServe
    }
    for route in suffixed:
        path, _ = _fill(route)
        found, _endpoint, match = router.resolve(path + "/a/b c", route.method)
        assert found is route and match["url_path"] == "a/b c"
        assert router.resolve(path, route.method)[2]["url_path"] is None
    # OIP paths take trailing slashes; unrouted /v2 paths get OIP's message.
    assert router.resolve("/v2/models/m/ready//", "GET")[2]["model_name"] == "m"
    with pytest.raises(NotFound, match="No route for GET /v2/nothing"):
        router.resolve("/v2/nothing", "GET")
    with pytest.raises(NotFound, match="please refer to API document"):
        router.resolve("/nothing", "GET")


def test_the_auth_flag_is_what_the_inference_app_enforces(tmp_path):
    # Every route the table marks ``auth`` asks the authorize hook (here: always refuse) before
    # anything else; the others answer without a key.
    registry, _ = _registry(tmp_path)
    asked: list[str] = []

    def refuse(scope: Any, api: str) -> None:
        asked.append(api)
        raise Unauthorized("no key")

    app = InferenceApp(
        DataPlane(registry, server_version="t"), max_request_size=1 << 20, authorize=refuse
    )
    for route in INFERENCE_ROUTES:
        path, _ = _fill(route)
        asked.clear()
        r = _call(app, route.method, path, content=b'{"instances": [1]}')
        if route.auth:
            assert r.status_code == 401, (route.method, route.path, r.status_code)
            assert asked == [route.key]
            assert ("error" in r.json()) == route.oip
        else:
            assert r.status_code != 401 and not asked, (route.method, route.path)


def test_torchserve_legacy_predict_paths_route_as_predictions():
    """TorchServe's legacy (MMS) ``/{model}[/{version}]/predict`` was a 404: it is the
    predictions endpoint for that model; a first segment that routes of ours begin with keeps
    its routes (an unrouted ``/v2/...`` is still OIP's 404)."""
    router = _router(INFERENCE_ROUTES)
    for method in ("POST", "PUT"):
        route, _, match = router.resolve("/mnist/predict", method)
        assert (route.endpoint, match["model_name"]) == ("predict", "mnist")
        route, _, match = router.resolve("/mnist/2.0/predict", method)
        assert (match["model_name"], match["model_version"]) == ("mnist", "2.0")
    for path in ("/v2/predict", "/v2/x/predict"):
        with pytest.raises(NotFound, match="No route for"):
            router.resolve(path, "POST")
    for path, method in (
        ("/mnist/predict", "GET"),
        ("/mnist/predicts", "POST"),
        ("/a/b/c/predict", "POST"),
    ):
        with pytest.raises(NotFound):
            router.resolve(path, method)


def test_torchserves_inference_routes_take_any_method():
    """TorchServe 0.12 runs the model whatever the method (tests/data/torchserve/workflows:
    predict_put, predict_get, predict_delete, predict_node_model_put, predict_node_model_get;
    tests/data/torchserve/methods); its docs upload with curl -T, a PUT, on /predictions,
    /explanations and /wfpredict alike."""
    router = _router(INFERENCE_ROUTES)
    paths = {
        "/predictions/m": "predict",
        "/predictions/m/1.0": "predict",
        "/explanations/m": "explain",
        "/explanations/m/1.0": "explain",
        "/wfpredict/w": "wfpredict",
    }
    for path, endpoint in paths.items():
        for method in ("POST", "PUT", "GET", "DELETE", "PATCH", "HEAD"):  # any method
            assert router.resolve(path, method)[0].endpoint == endpoint, (method, path)


@pytest.mark.slow
def test_legacy_predict_answers_as_predictions(live_server) -> None:
    import httpx

    from .conftest import probe_models

    server = live_server(models=probe_models())
    body = {"x": [0.5] * 64}
    answers = [
        httpx.post(f"{server.url}{path}", json=body, timeout=60)
        for path in ("/predictions/probe", "/probe/predict", "/probe/1.0/predict")
    ]
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
    assert answers[1].json() == answers[0].json() == answers[2].json()
    missing = httpx.post(f"{server.url}/nope/predict", json=body, timeout=60)
    assert missing.status_code == 404 and "nope" in missing.json()["message"]
