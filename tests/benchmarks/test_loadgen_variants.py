"""Request variants (``Target.paths``): the load generator sends them in turn and says which one
each answer was, as the many-models study needs for its Zipf mix (results/multiplex/run.py)."""

from __future__ import annotations

import array
import collections
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.benchmarks.conftest import load_study
from torchbay.benchmarks.loadgen import LoadGenerator, LoadPlan, Target
from torchbay.benchmarks.round2_overload import answers

multiplex = load_study("results/multiplex/run.py")


class _ByPath(BaseHTTPRequestHandler):
    """Keep-alive HTTP/1.1: 200 for /predictions/a, 404 for any other path."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        status = 200 if self.path == "/predictions/a" else 404
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:  # quiet
        pass


@pytest.fixture(scope="module")
def by_path() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ByPath)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_variants_are_sent_in_turn_and_named_in_the_timeline(
    gen: LoadGenerator, by_path: int
) -> None:
    paths = ("/predictions/a", "/predictions/b", "/predictions/b")
    target = Target("127.0.0.1", by_path, "", (b"{}",), paths=paths)
    assert len(target.requests()) == 3
    result = gen.run(LoadPlan(target, concurrency=2, duration_s=None, requests=30, timeline=True))
    variants = array.array("I", result.variants)
    assert len(variants) == result.completed == 30
    assert collections.Counter(variants) == {0: 10, 1: 10, 2: 10}
    for index, answer in zip(variants, answers(result.timeline), strict=True):
        assert answer.status == (200 if index == 0 else 404)
    assert result.statuses == {"200": 10, "404": 20}


def test_one_request_per_variant_names_each_answer(gen: LoadGenerator, by_path: int) -> None:
    """``requests`` = the number of variants: each sent once, each answer named by its variant
    with its own status and latency (the study's first request to each hot model)."""
    target = Target("127.0.0.1", by_path, "", (b"{}",), paths=("/predictions/a", "/predictions/b"))
    result = gen.run(LoadPlan(target, concurrency=2, duration_s=None, requests=2, timeline=True))
    pairs = zip(array.array("I", result.variants), answers(result.timeline), strict=True)
    answered = sorted((v, a.status, a.latency) for v, a in pairs)
    assert [(v, status) for v, status, _ in answered] == [(0, 200), (1, 404)]
    assert all(seconds > 0 for _, _, seconds in answered)


def test_zipf_mix_is_seeded_and_skewed_to_the_first_ranks() -> None:
    mix = multiplex.zipf_mix(200, 1.1, seed=1, draws=5000)
    assert mix == multiplex.zipf_mix(200, 1.1, seed=1, draws=5000)
    assert mix != multiplex.zipf_mix(200, 1.1, seed=2, draws=5000)
    counts = collections.Counter(mix)
    assert counts.most_common(1)[0][0] == "m001"
    # 1/k^1.1 over 200 ranks: the first ten take ~57% of the requests.
    hot = sum(counts[multiplex.name(k)] for k in range(1, 11)) / len(mix)
    assert hot == pytest.approx(0.57, abs=0.03)


def test_open_loop_sends_its_budget_on_schedule(gen: LoadGenerator, by_path: int) -> None:
    """An open loop of 20 requests at 200/s: each is sent, answered and timed from its schedule
    (the send lag is recorded in open loop only)."""
    target = Target("127.0.0.1", by_path, "/predictions/a", (b"{}",))
    plan = LoadPlan(target, "open", rate=200.0, duration_s=None, requests=20, timeline=True)
    result = gen.run(plan)
    assert (result.sent, result.completed, result.statuses) == (20, 20, {"200": 20})
    assert result.lag.count == result.latency.count == 20
    starts = [answer.start for answer in answers(result.timeline)]
    assert max(starts) - min(starts) == pytest.approx(19 / 200, abs=0.002)
    closed = gen.run(LoadPlan(target, concurrency=2, duration_s=None, requests=20))
    assert (closed.completed, closed.lag.count, closed.offered_rate) == (20, 0, None)


def test_refused_and_unanswered_requests_are_counted(gen: LoadGenerator) -> None:
    """A port nobody listens on: every send is a conn-error. A server that accepts and never
    answers: the requests in flight when the run gives up count as timeouts."""
    with socket.socket() as closed_port:
        closed_port.bind(("127.0.0.1", 0))
        port = closed_port.getsockname()[1]
    refused = Target("127.0.0.1", port, "/", (b"{}",))
    result = gen.run(LoadPlan(refused, concurrency=1, duration_s=None, requests=5))
    assert result.statuses == {"conn-error": 5} and result.ok == 0
    with socket.create_server(("127.0.0.1", 0)) as silent:
        mute = Target("127.0.0.1", silent.getsockname()[1], "/", (b"{}",))
        plan = LoadPlan(mute, concurrency=3, duration_s=0.2, timeout_s=0.5)
        result = gen.run(plan)
    assert result.statuses == {"timeout": 3} and result.sent == 3


@pytest.fixture(scope="module")
def grpc_echo() -> Iterator[int]:
    """A gRPC server whose method /t.Echo/Say answers the request's bytes."""
    import grpc

    server = grpc.server(ThreadPoolExecutor(2))
    say = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Echo", {"Say": say}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port
    server.stop(0)


def test_grpc_calls_share_one_channel_and_name_their_status(
    gen: LoadGenerator, grpc_echo: int
) -> None:
    """OK counts as 200; any other status by its code's name."""
    target = Target("127.0.0.1", grpc_echo, "", (b"ping",), grpc="/t.Echo/Say")
    result = gen.run(LoadPlan(target, concurrency=3, duration_s=None, requests=12))
    assert result.statuses == {"200": 12} and result.latency.count == 12
    missing = Target("127.0.0.1", grpc_echo, "", (b"ping",), grpc="/t.Echo/Nope")
    result = gen.run(LoadPlan(missing, "open", rate=100.0, duration_s=None, requests=4))
    assert result.statuses == {"UNIMPLEMENTED": 4} and result.ok == 0


def test_a_grpc_port_nobody_listens_on_is_a_conn_error(gen: LoadGenerator) -> None:
    """grpc names a refused connection UNAVAILABLE, as it names a server's 503 (overloaded):
    the refused call is a conn-error, as over HTTP, and no latency of an answer never given."""
    with socket.socket() as closed_port:
        closed_port.bind(("127.0.0.1", 0))
        port = closed_port.getsockname()[1]
    refused = Target("127.0.0.1", port, "", (b"ping",), grpc="/t.Echo/Say")
    result = gen.run(LoadPlan(refused, concurrency=1, duration_s=None, requests=3, timeout_s=5))
    assert result.statuses == {"conn-error": 3} and result.latency.count == 0


def test_two_processes_split_a_stepped_open_loop(by_path: int) -> None:
    """Steps of 50/s then 100/s for 0.2 s each over two processes: each runs half of each step,
    staggered, so together they send exactly 10 then 20 requests."""
    target = Target("127.0.0.1", by_path, "/predictions/a", (b"{}",))
    steps = ((0.2, 50.0), (0.2, 100.0))
    plan = LoadPlan(target, "open", rate=100.0, duration_s=0.4, steps=steps, timeline=True)
    with LoadGenerator(2) as two:
        result = two.run(plan)
    starts = sorted(answer.start for answer in answers(result.timeline))
    assert result.sent == result.statuses["200"] == len(starts) == 30
    assert sum(start < 0.19 for start in starts) == 10  # the last of the first: 0.18 s
    assert starts[1] - starts[0] == pytest.approx(1 / 50)  # interleaved, not side by side


def test_fewer_connections_than_processes_still_send_every_request(by_path: int) -> None:
    """``-c 1 -n 10 --procs 2``: one process has no connection; the request budget goes to the
    one that has (it was split over both, and the idle one's half was never sent: 5 of 10)."""
    target = Target("127.0.0.1", by_path, "/predictions/a", (b"{}",))
    with LoadGenerator(2) as two:
        result = two.run(LoadPlan(target, concurrency=1, duration_s=None, requests=10))
        assert (result.sent, result.statuses) == (10, {"200": 10})
        result = two.run(LoadPlan(target, concurrency=3, duration_s=None, requests=7))
        assert (result.sent, result.statuses) == (7, {"200": 7})


def test_open_loop_requests_never_sent_count_as_timeouts(gen: LoadGenerator) -> None:
    """An open loop on a server that never answers, its 2 connections stuck: the 28 requests
    still queued for a connection when the run gives up were scheduled in the window and never
    answered. They count as sent and timed out (they vanished: '2 sent, 2 timeouts', a 2-request
    run where 30 were offered, and an error rate over 2 sends)."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        mute = Target("127.0.0.1", silent.getsockname()[1], "/", (b"{}",))
        plan = LoadPlan(mute, "open", rate=100.0, duration_s=0.3, timeout_s=0.5, max_connections=2)
        result = gen.run(plan)
    assert result.statuses == {"timeout": 30} and result.sent == 30 and result.ok == 0
