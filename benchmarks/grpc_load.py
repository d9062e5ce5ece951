"""``torchbay bench run --protocol grpc``: the same load over gRPC, beside HTTP.

A closed loop of ``--concurrency`` callers, each sending TorchServe's gRPC ``Predictions`` (the
input file as the ``data`` entry, the inference key as ``authorization`` metadata) back to back
over one grpcio asyncio channel, in this process. With ``--archive`` the server is started once
(gRPC on free ports) and the same closed loop runs first over HTTP (``/predictions``, the regular
load generator), then over gRPC: two reports on one server. With ``--url`` it is the server's
gRPC inference address (``http://host:7070``) and only gRPC runs. Torch-free.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from torchbay.benchmarks import scrape
from torchbay.benchmarks.bench import BenchReport, RunOptions, load_payloads, run_bench
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.loadplan import LoadResult
from torchbay.benchmarks.managed import Endpoints, ManagedServer, parse_url, read_key_file
from torchbay.benchmarks.stats import summarize

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

    def messages(self, request_type: Any) -> list[Any]:
        """The request messages, in order: the prebuilt ones, else one Predictions per payload."""
        if self.requests is not None:
            return list(self.requests)
        return [
            request_type(
                model_name=self.model, model_version=self.version or "", input={"data": body}
            )
            for body in self.payloads
        ]


async def _closed_loop(
    target: GrpcTarget, concurrency: int, seconds: float, timeout_s: float
) -> tuple[list[float], dict[str, int], int]:
    """(latencies of the OK answers, statuses, sent) over ``seconds`` of back-to-back calls."""
    import grpc

    from torchbay.server.grpc.messages import method_types

    request_type, response_type, *_ = method_types(target.service, target.method)
    requests = target.messages(request_type)
    metadata = [("authorization", f"Bearer {target.key}")] if target.key else None
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    sent = 0
    options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    async with grpc.aio.insecure_channel(target.address, options=options) as channel:
        call = channel.unary_unary(
            f"/{target.service}/{target.method}",
            request_serializer=request_type.SerializeToString,
            response_deserializer=response_type.FromString,
        )
        end = time.perf_counter() + seconds

        async def caller(index: int) -> None:
            nonlocal sent
            i = index
            while time.perf_counter() < end:
                start = time.perf_counter()
                sent += 1
                try:
                    await call(requests[i % len(requests)], metadata=metadata, timeout=timeout_s)
                    code = "200"
                    latencies.append(time.perf_counter() - start)
                except grpc.aio.AioRpcError as exc:
                    code = exc.code().name
                statuses[code] = statuses.get(code, 0) + 1
                i += concurrency

        await asyncio.gather(*(caller(i) for i in range(concurrency)))
    return latencies, statuses, sent


def run_grpc_load(
    target: GrpcTarget,
    concurrency: int,
    seconds: float,
    warmup_s: float,
    timeout_s: float,
    on_warm: Callable[[], None] = lambda: None,
) -> LoadResult:
    """Warm up, then measure one closed loop; the result in the HTTP generator's shape.
    ``on_warm`` runs between the two (the server view's first scrape)."""
    if warmup_s > 0:
        asyncio.run(_closed_loop(target, concurrency, warmup_s, timeout_s))
    on_warm()
    cpu0, t0 = time.process_time(), time.perf_counter()
    latencies, statuses, sent = asyncio.run(_closed_loop(target, concurrency, seconds, timeout_s))
    window = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    ok = statuses.get("200", 0)
    summary = summarize(latencies)
    return LoadResult(
        mode="closed",
        offered_rate=None,
        concurrency=concurrency,
        window_s=window,
        sent=sent,
        completed=sum(statuses.values()),
        ok=ok,
        statuses=statuses,
        latency=summary,
        service=summary,
        lag=summarize([]),
        req_per_s=sent / window,
        ok_per_s=ok / window,
        generator_cpu_pct=[100 * cpu / window],
        behind=[],
        generator_cpu_s=cpu,
    )


def grpc_report(target: GrpcTarget, options: RunOptions) -> BenchReport:
    assert options.concurrency is not None
    scrapes: list[scrape.Snapshot | None] = []
    result = run_grpc_load(
        target,
        options.concurrency,
        options.duration_s or 10.0,
        options.warmup_s,
        options.timeout_s,
        on_warm=lambda: scrapes.append(_scrape(target)),
    )
    before, after = scrapes[0], _scrape(target)
    view = None
    if before is not None and after is not None:
        view = scrape.server_view(before, after, target.model, target.version)
    return BenchReport(
        model=target.model,
        version=target.version,
        url=target.url,
        settings={},
        result=result,
        server=view,
    )


def _scrape(target: GrpcTarget) -> scrape.Snapshot | None:
    if target.metrics_port is None:
        return None
    return scrape.parse_snapshot(scrape.fetch_metrics(target.host, target.metrics_port))


def run_grpc_bench(
    options: RunOptions, on_progress: Callable[[Any], None] | None = None
) -> list[BenchReport]:
    """The HTTP report then the gRPC one (``--archive``), or the gRPC one (``--url``)."""
    if options.concurrency is None or options.requests is not None:
        raise BenchError("--protocol grpc runs a closed loop: give --concurrency and --duration")
    payloads, _ = load_payloads(options.inputs, "predict")
    if options.url is not None:
        host, port, _path = parse_url(options.url)
        key = options.token
        if options.key_file is not None:
            key = read_key_file(options.key_file)[0]
        target = GrpcTarget(host, port, options.model or "", options.version, key, payloads)
        return [grpc_report(target, options)]
    return _with_archive(options, payloads, on_progress)


def _with_archive(
    options: RunOptions, payloads: tuple[bytes, ...], on_progress: Callable[[Any], None] | None
) -> list[BenchReport]:
    with started_server(options) as (endpoints, grpc_port, model, _run_dir):
        http = run_bench(http_options(options, endpoints, model), on_progress)
        target = GrpcTarget(
            endpoints.host,
            grpc_port,
            model,
            options.version,
            endpoints.inference_key,
            payloads,
            endpoints.metrics_port,
        )
        return [http, replace(grpc_report(target, options), settings=http.settings)]


@contextmanager
def started_server(options: RunOptions) -> Iterator[tuple[Endpoints, int, str, Path]]:
    """``torchbay serve`` for ``options.archive`` with gRPC on free ports, stopped on exit:
    (its endpoints, its gRPC inference port, the model's name, the run folder)."""
    from torchbay.archiver.manifest import read_manifest

    assert options.archive is not None
    model = options.model or read_manifest(options.archive).model.model_name
    with ExitStack() as stack:
        run_dir = options.run_dir or Path(stack.enter_context(_tempdir()))
        previous = {k: os.environ.get(k) for k in _FREE_GRPC_PORTS}
        os.environ.update(_FREE_GRPC_PORTS)  # the server inherits them: gRPC on free ports
        try:
            server = ManagedServer.torchbay(options.archive, run_dir)
            endpoints = stack.enter_context(server)
        finally:
            for k, v in previous.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        ready = json.loads(server.ready_file.read_text())
        yield endpoints, int(ready["grpc_inference"]), model, run_dir


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


_FREE_GRPC_PORTS = {"TORCHBAY_GRPC_INFERENCE_PORT": "0", "TORCHBAY_GRPC_MANAGEMENT_PORT": "0"}


def _tempdir() -> Any:
    import tempfile

    return tempfile.TemporaryDirectory(prefix="tb-bench-grpc-")


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
