"""``torchbay bench run --protocol grpc``: the same load over gRPC, beside HTTP.

A closed loop of ``--concurrency`` callers, each sending TorchServe's gRPC ``Predictions`` (the
input file as the ``data`` entry, the inference key as ``authorization`` metadata) back to back
over one grpcio asyncio channel, run by the load generator that HTTP's load uses (its own
process; the same report fields). With ``--archive`` the server is started once (gRPC on free
ports) and the same closed loop runs first over HTTP (``/predictions``), then over gRPC: two
reports on one server. With ``--url`` it is the server's gRPC inference address
(``http://host:7070``) and only gRPC runs. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from torchbay.benchmarks import scrape
from torchbay.benchmarks.bench import BenchReport, RunOptions, load_payloads, open_server, run_bench
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.loadgen import LoadGenerator, LoadPlan, LoadResult, Target
from torchbay.benchmarks.managed import Endpoints

SERVICE = "org.pytorch.serve.grpc.inference.InferenceAPIsService"


class GrpcTarget:
    """Where and what the gRPC load sends."""

    def __init__(
        self,
        host: str,
        port: int,
        model: str,
        version: str | None,
        key: str | None,
        payloads: tuple[bytes, ...],
        metrics_port: int | None = None,
        service: str = SERVICE,
        method: str = "Predictions",
    ) -> None:
        self.address = f"{host}:{port}"
        self.host, self.model, self.version, self.key = host, model, version, key
        self.payloads, self.metrics_port = payloads, metrics_port
        self.service, self.method = service, method
        # Prebuilt request messages (sent in turn); None: Predictions requests from ``payloads``.
        self.requests: tuple[Any, ...] | None = None

    @property
    def url(self) -> str:
        return f"grpc://{self.address}/{self.service}/{self.method}"

    def load_target(self) -> Target:
        """The load generator's target: the request messages serialized (the prebuilt ones, else
        one Predictions per payload), the inference key as ``authorization`` metadata."""
        from torchbay.server.grpc.messages import method_types

        request_type = method_types(self.service, self.method)[0]
        messages = self.requests or [
            request_type(model_name=self.model, model_version=self.version or "", input={"data": b})
            for b in self.payloads
        ]
        key = (("authorization", f"Bearer {self.key}"),) if self.key else ()
        port = int(self.address.rsplit(":", 1)[1])
        payloads = tuple(m.SerializeToString() for m in messages)
        return Target(self.host, port, "", payloads, key, grpc=f"/{self.service}/{self.method}")


def run_grpc_load(
    target: GrpcTarget,
    concurrency: int,
    seconds: float,
    warmup_s: float,
    timeout_s: float,
    on_warm: Callable[[], None] = lambda: None,
) -> LoadResult:
    """Warm up, then measure one closed loop on the load generator (its own process, one
    channel); ``on_warm`` runs between the two (the server view's first scrape)."""
    plan = LoadPlan(
        target.load_target(), "closed", concurrency, duration_s=seconds, timeout_s=timeout_s
    )
    with LoadGenerator() as gen:
        if warmup_s > 0:
            gen.run(replace(plan, duration_s=warmup_s))
        on_warm()
        return gen.run(plan)


def grpc_report(target: GrpcTarget, options: RunOptions) -> BenchReport:
    """One gRPC closed loop as ``options`` say, with the server's view around the measured run."""
    assert options.concurrency is not None
    notes: list[str] = []
    scrapes: list[scrape.Snapshot | None] = []
    where = (target.host, target.metrics_port, notes)
    result = run_grpc_load(
        target,
        options.concurrency,
        options.duration_s or 10.0,
        options.warmup_s,
        options.timeout_s,
        on_warm=lambda: scrapes.append(scrape.snapshot(*where)),
    )
    before, after = scrapes[0], scrape.snapshot(*where)
    view = None
    if before is not None and after is not None:
        view = scrape.server_view(before, after, target.model, target.version)
    notes.extend(result.behind)  # as bench run says when the generator fell behind
    return BenchReport(target.model, target.version, target.url, {}, result, view, tuple(notes))


def run_grpc_bench(
    options: RunOptions, on_progress: Callable[[Any], None] | None = None
) -> list[BenchReport]:
    """The HTTP report then the gRPC one (``--archive``), or the gRPC one (``--url``)."""
    closed_loop_only(options, "grpc")
    payloads, _ = load_payloads(options.inputs, "predict")

    def target(endpoints: Endpoints, port: int, model: str) -> GrpcTarget:
        key, metrics = endpoints.inference_key, endpoints.metrics_port
        return GrpcTarget(endpoints.host, port, model, options.version, key, payloads, metrics)

    return run_pair(options, target, {}, on_progress)


def closed_loop_only(options: RunOptions, protocol: str) -> None:
    if options.concurrency is None or options.requests is not None:
        raise BenchError(
            f"--protocol {protocol} runs a closed loop: give --concurrency and --duration"
        )


def run_pair(
    options: RunOptions,
    target: Callable[[Endpoints, int, str], GrpcTarget],
    http_update: dict[str, Any],
    on_progress: Callable[[Any], None] | None,
) -> list[BenchReport]:
    """On a server started from ``--archive``: the HTTP report (``options`` with ``http_update``)
    then the gRPC one, on one server. With ``--url`` (the server's gRPC address): gRPC alone."""
    with open_server(options) as (endpoints, model, _version):
        if options.url is not None:
            return [grpc_report(target(endpoints, endpoints.inference_port, model), options)]
        assert endpoints.grpc_port is not None
        http = run_bench(http_options(options, endpoints, model, **http_update), on_progress)
        grpc_ = grpc_report(target(endpoints, endpoints.grpc_port, model), options)
        return [http, replace(grpc_, settings=http.settings)]


def http_options(
    options: RunOptions, endpoints: Endpoints, model: str, **update: Any
) -> RunOptions:
    """``options`` aimed at the started server's HTTP inference listener (``update`` on top)."""
    return options.model_copy(
        update={
            "archive": None,
            "url": f"http://{endpoints.host}:{endpoints.inference_port}",
            "model": model,
            "token": endpoints.inference_key,
            "metrics_url": f"http://{endpoints.host}:{endpoints.metrics_port}",
            **update,
        }
    )


def format_side_by_side(reports: list[BenchReport]) -> str:
    """Each report's table, then one line comparing gRPC with HTTP."""
    from torchbay.benchmarks.bench import format_report

    text = "\n\n".join(format_report(r) for r in reports)
    if len(reports) == 2:
        http, grpc_ = (r.result for r in reports)
        text += (
            f"\n\ngRPC vs HTTP: {grpc_.ok_per_s:,.1f} vs {http.ok_per_s:,.1f} ok/s, "
            f"p50 {grpc_.latency.p50_ms:.2f} vs {http.latency.p50_ms:.2f} ms, "
            f"p99 {grpc_.latency.p99_ms:.2f} vs {http.latency.p99_ms:.2f} ms"
        )
    return text
