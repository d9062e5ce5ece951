"""TorchServe's own Postman management collection, replayed whole against a live torchbay
(tests/server/postman_replay.py): every one of its 82 rows answers the status code the
collection expects, except the rows listed in DIFFERENCES (each a row of the README's
"Differences from TorchServe"). TorchServe 0.12 on this machine (management_ts012.json, with the
command that made it) misses 5 rows of its own collection: they are compared too, so that a
change in either shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.server import postman_replay
from tests.server.conftest import LiveServer, make_config

RECORD = json.loads((postman_replay.DATA / "management_ts012.json").read_text())["answers"]
# row -> (torchbay's status, why). Unsafe or unbuildable here, kept on purpose.
DIFFERENCES = {
    # TorchServe downloads into the model store and refuses (500) a name already there; torchbay
    # keeps no downloads in the store, so here (no internet) the download itself fails: 400.
    3: (400, "the download fails offline; no 'file already exists' check"),
    # A negative min_worker: TorchServe's 500 is an IndexOutOfBoundsException, ours a clear 400.
    68: (400, "a negative min_worker is a 400"),
}
# TorchServe allows every URL by default; torchbay none: the zoo's host, as the collection uses it.
ZOO_URLS = [r"https://torchserve\.pytorch\.org/.*"]


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    store = postman_replay.build_zoo(tmp_path_factory.mktemp("postman-zoo"))
    config = make_config(
        store, enable_model_api=True, disable_system_metrics=True, allowed_urls=ZOO_URLS
    )
    server = LiveServer(config).start()
    try:
        return postman_replay.replay(server.management_url)
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.timeout(900)  # 82 requests, a dozen of which start or fail workers
def test_the_management_collection_passes_whole(answers):
    failed = []
    for answer in answers:
        expected, why = DIFFERENCES.get(answer["row"], (answer["expected"], ""))
        if answer["status"] != expected:
            failed.append(
                f"row {answer['row']} {answer['request']}: {answer['status']} "
                f"(collection {answer['expected']}{', ' + why if why else ''}) "
                f"{answer['body'][:160]}"
            )
    assert failed == [], "\n".join(failed)


def test_the_record_is_torchserves_run_of_the_same_rows():
    """What TorchServe 0.12 answered here, row by row: the same requests as the replay makes,
    and where it misses its own collection (so that the README can say so)."""
    rows = postman_replay.rows()
    assert len(RECORD) == len(rows) == 82
    env = postman_replay.environment()
    for answer, row in zip(RECORD, rows, strict=True):
        assert (
            answer["request"]
            == f"{row['METHOD'].upper()} /{postman_replay.substitute(row['path'], env)}"
        )
    misses = {a["row"]: a["status"] for a in RECORD if a["status"] != a["expected"]}
    # A failed registration stays registered (31: 409), a start failure on tiny stand-ins (35, 37)
    # leaves nothing to unregister (36, 38).
    assert misses == {31: 409, 35: 500, 36: 404, 37: 500, 38: 404}


@pytest.mark.slow
def test_torchbay_answers_where_torchserve_missed_its_own_collection(answers):
    by_row = {a["row"]: a for a in answers}
    for row in (31, 35, 36, 37, 38):
        assert by_row[row]["status"] == by_row[row]["expected"], by_row[row]


URL_FORMS = json.loads((postman_replay.DATA.parent / "url_forms.json").read_text())
# url -> (torchbay's status, why): TorchServe's answer is a quirk or unsafe.
URL_DIFFERENCES = {
    # TorchServe treats file:// as a download into its own store and trips on the file there.
    "file://{store}/mnist.mar": (200, "file:// names a store archive, as a plain path does"),
    "file://mnist.mar": (200, "file:// names a store archive, as a plain path does"),
    # TorchServe reads a path relative to its working directory, outside the store's names.
    "store/mnist.mar": (404, "only the model store's archives"),
}


@pytest.mark.slow
def test_url_forms_of_the_same_archive_answer_as_torchserve(tmp_path: Path):
    """The forms a script may name a store archive by, against TorchServe 0.12's answers
    (url_forms.json): the same status, and the same message for the 404s."""
    import urllib.parse

    import httpx

    store = postman_replay.build_zoo(tmp_path / "store")
    server = LiveServer(make_config(store, enable_model_api=True)).start()
    try:
        for answer in URL_FORMS["answers"]:
            url = answer["url"].replace("{store}", str(store))
            quoted = urllib.parse.quote(url, safe="")
            reply = httpx.post(
                f"{server.management_url}/models?url={quoted}&model_name=m", timeout=60
            )
            expected = URL_DIFFERENCES.get(answer["url"], (answer["status"], ""))[0]
            assert reply.status_code == expected, (url, reply.text)
            if expected == 404 and "message" in answer:
                message = answer["message"].replace(URL_FORMS["store"], str(store))
                assert reply.json()["message"] == message
            httpx.delete(f"{server.management_url}/models/m", timeout=60)
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.timeout(900)  # 22 rows, 10 of which start a worker
def test_the_inference_collection_passes_on_stand_ins(tmp_path: Path):
    """TorchServe's Postman inference collection (tests/server/postman_inference.py): every row
    whose archive can be built offline registers, answers, unregisters and leaves the metrics
    line the collection matches; the rows that download from the zoo fail at registration only."""
    from tests.server import postman_inference

    store = postman_inference.stand_ins(tmp_path / "store")
    config = make_config(
        store,
        enable_model_api=True,
        disable_system_metrics=True,
        allowed_urls=[*ZOO_URLS, r"https://torchserve\.s3\.amazonaws\.com/.*"],
    )
    server = LiveServer(config).start()
    try:
        urls = {"inference": server.url, "management": server.management_url}
        answers = postman_inference.replay({**urls, "metrics": server.metrics_url})
    finally:
        server.stop()
    local = [a for a in answers if not a["url"].startswith("https://")]
    assert len(local) == 10 and len(answers) == 22
    for answer in local:
        assert answer["status"] == [200, 200, 200, 200] and answer["metrics_match"], answer
    detections = json.loads(next(a for a in local if a["model"] == "fastrcnn")["answer"])
    assert [set(found) for found in detections] == [{"1", "score"}]  # label 1, no mapping
    for answer in answers:
        if answer["url"].startswith("https://"):  # offline: the download fails, a clear 400
            assert answer["status"][:3] == [400, 404, 404], answer
