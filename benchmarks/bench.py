"""``torchbay bench run`` (:func:`run_bench`), the options every load-sending command shares
(:class:`LoadOptions`, also its flags) and the benchmarks' one measured window (:func:`window`)."""

from __future__ import annotations

import base64
import json
import mimetypes
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from torchbay.benchmarks import scrape
from torchbay.benchmarks.errors import BenchError
from torchbay.benchmarks.loadgen import Interrupted, LoadGenerator, LoadPlan, LoadResult
from torchbay.benchmarks.loadplan import Progress, Target
from torchbay.benchmarks.managed import QUERY_NAMES, Endpoints, ManagedServer, Management, bearer
from torchbay.benchmarks.report import num
from torchbay.benchmarks.scenarios import Batching
from torchbay.benchmarks.stats import Arrival, LatencySummary

Protocol = Literal["predict", "v2"]
W = TypeVar("W")  # what a window's watch returns
LOAD_SETTINGS = ("arrival", "warmup_s", "duration_s", "requests", "timeout_s", "processes")


def flag(default: Any, *names: str, help: str | None = None, **kw: Any) -> Any:
    """A field that is also a command-line flag (``cli.add_flags`` builds it from the field):
    ``names`` (default ``--field-name``); ``kw`` holds the field's constraints and the flag's
    ``metavar`` and ``group`` (a required mutually exclusive group of the command)."""
    extra = {k: kw.pop(k) for k in ("metavar", "group") if k in kw}
    return Field(default, description=help, json_schema_extra={"flags": names, **extra}, **kw)


class LoadOptions(BaseModel):
    """What every load-sending command takes: the request bodies, their route, the processes."""

    model_config = ConfigDict(frozen=True, allow_inf_nan=False)  # inf: a run that never ends

    inputs: tuple[Path, ...] = flag(
        (),
        "--input",
        metavar="FILE",
        help="request body file; repeat for several (cycled in order)",
    )
    content_type: str | None = flag(
        None, help="default: from the file suffix (octet-stream otherwise)"
    )
    protocol: Protocol = flag(
        "predict", help="TorchServe /predictions route or the OIP /v2/models/{m}/infer route"
    )
    processes: int = flag(
        1, "--procs", metavar="N", help="load generator processes (default 1)", ge=1
    )
    seed: int = flag(0)
    # Extra request headers (not a CLI flag): the OIP binary body's Inference-Header-Content-Length.
    headers: tuple[tuple[str, str], ...] = ()

    @model_validator(mode="after")
    def _some_input(self) -> LoadOptions:
        if not self.inputs:
            raise ValueError("give at least one input file")
        return self


class RunOptions(LoadOptions):
    """``bench run``'s options: one of ``url`` / ``archive``, one of ``concurrency`` / ``rate``."""

    url: str | None = flag(
        None, group="where", help="a running server's inference base URL, http://host:port"
    )
    archive: Path | None = flag(
        None, group="where", help="start a server for this .mar and stop it after"
    )
    model: str | None = flag(None, help="model name (default: the archive's)")
    version: str | None = flag(None, "--model-version")
    token: str | None = flag(None, help="inference API key (Bearer)")
    key_file: Path | None = flag(None, help="the server's key_file.json")
    metrics_url: str | None = flag(None, help="with --url: metrics base URL for the server's view")
    management_url: str | None = flag(None, help="with --url: management base URL (for settings)")
    batch_size: int | None = flag(None, ge=1)
    max_batch_delay_ms: float | None = flag(None, "--max-batch-delay", metavar="MS", ge=0)
    workers: int | None = flag(None, ge=1)
    concurrency: int | None = flag(
        None, "--concurrency", "-c", group="load", help="closed loop with N connections", ge=1
    )
    rate: float | None = flag(
        None, "--rate", "-r", group="load", help="open loop at R requests/s", gt=0
    )
    arrival: Arrival = flag("constant")
    duration_s: float | None = flag(
        None, "--duration", metavar="S", help="measured seconds (default 10)", gt=0
    )
    requests: int | None = flag(
        None, "--requests", "-n", help="measured requests instead of a duration", ge=1
    )
    warmup_s: float = flag(2.0, "--warmup", metavar="S", ge=0)
    timeout_s: float = flag(10.0, "--timeout", metavar="S", gt=0)
    max_connections: int = flag(1024, ge=1)
    run_dir: Path | None = None

    @model_validator(mode="after")
    def _one_of(self) -> RunOptions:
        if (self.url is None) == (self.archive is None):
            raise ValueError("give exactly one of url (a running server) or archive")
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of concurrency (closed loop) or rate (open loop)")
        if self.url is not None and self.model is None:
            raise ValueError("model is required with url")
        return self

    def plan(self, target: Target) -> LoadPlan:
        """The load on ``target``: the plan's fields of the same name are these options'."""
        duration = self.duration_s if self.duration_s or self.requests else 10.0
        same = ("arrival", "requests", "warmup_s", "timeout_s", "seed", "max_connections")
        load = {k: getattr(self, k) for k in same}
        return LoadPlan.of(target, self.concurrency, self.rate, duration_s=duration, **load)


@dataclass(frozen=True)
class BenchReport:
    """One run: what was measured, the client's numbers and the server's own view."""

    model: str
    version: str | None
    url: str
    settings: dict[str, Any]
    result: LoadResult
    server: scrape.ServerView | None
    notes: tuple[str, ...] = ()
    load: dict[str, Any] = field(default_factory=dict)  # the generator's settings (LOAD_SETTINGS)

    def as_dict(self) -> dict[str, Any]:
        head = {k: getattr(self, k) for k in ("model", "version", "url", "settings", "load")}
        server = self.server.as_dict() if self.server else None
        return {**head, "client": self.result.as_dict(), "server": server, "notes": [*self.notes]}


def load_payloads(paths: tuple[Path, ...], protocol: Protocol) -> tuple[bytes, ...]:
    """The request bodies, in order; for the OIP route a non-JSON file is wrapped into a v2
    request with one BYTES input (``data``) holding it base64-encoded."""
    bodies = []
    for path in paths:
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise BenchError(f"cannot read input {path}: {exc}") from None
        if protocol == "v2" and not raw.lstrip().startswith(b"{"):
            data = [base64.b64encode(raw).decode()]
            tensor = {"name": "data", "shape": [1], "datatype": "BYTES", "data": data}
            raw = json.dumps({"inputs": [tensor]}).encode()
        bodies.append(raw)
    return tuple(bodies)


def route(protocol: Protocol, model: str, version: str | None) -> str:
    """The inference path for a model: TorchServe's predictions or the OIP infer route."""
    if protocol == "v2":
        return f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    return f"/predictions/{model}" + (f"/{version}" if version else "")


def make_target(
    endpoints: Endpoints, options: LoadOptions, model: str, version: str | None
) -> Target:
    """The HTTP target of ``options`` (``bench run``'s or the SLA search's) on ``endpoints``."""
    by_suffix = mimetypes.guess_type(options.inputs[0].name)[0] or "application/octet-stream"
    v2 = "application/json"  # a v2 body is JSON, wrapped or not
    content_type = options.content_type or (v2 if options.protocol == "v2" else by_suffix)
    headers = {"Content-Type": content_type, **bearer(endpoints.inference_key)}
    payloads = load_payloads(options.inputs, options.protocol)
    path = route(options.protocol, model, version)
    head = (*headers.items(), *options.headers)
    return Target(endpoints.host, endpoints.inference_port, path, payloads, head)


@contextmanager
def open_server(options: RunOptions) -> Iterator[tuple[Endpoints, str, str | None]]:
    """Yield (endpoints, model, version): the URL's, or a started archive's (stopped after)."""
    if options.url is not None:
        yield Endpoints.at(options), options.model or "", options.version
        return
    from torchbay.archiver.manifest import read_manifest

    assert options.archive is not None
    model = options.model or read_manifest(options.archive).model.model_name
    with ExitStack() as stack:
        run_dir = options.run_dir
        if run_dir is None:
            run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tb-bench-")))
        endpoints = stack.enter_context(ManagedServer.torchbay(options.archive, run_dir))
        yield endpoints, model, options.version


def run_bench(
    options: RunOptions, on_progress: Callable[[Progress], None] | None = None
) -> BenchReport:
    """One load test as ``options`` say: the client's and the server's numbers."""
    with open_server(options) as (endpoints, model, version):
        configure(options, endpoints, model, version)
        target = make_target(endpoints, options, model, version)
        return measure(options, endpoints, model, version, target, on_progress)


def configure(options: RunOptions, endpoints: Endpoints, model: str, version: str | None) -> None:
    """Apply the batching and worker flags through the management API (none given: nothing)."""
    settings = Batching(options.batch_size, options.max_batch_delay_ms, options.workers)
    if settings.keys():
        _management(endpoints).configure(model, version, settings)


def measure(
    options: RunOptions,
    endpoints: Endpoints,
    model: str,
    version: str | None,
    target: Target,
    on_progress: Callable[[Progress], None] | None = None,
) -> BenchReport:
    """Warm up, run on ``target`` between two ``/metrics`` scrapes, read the settings back."""
    notes: list[str] = []
    plan, stop = options.plan(target), None
    with LoadGenerator(options.processes) as gen:
        measured = replace(plan, warmup_s=0.0)  # warmed up apart, before the window
        try:
            result, view = observe(
                gen, endpoints, model, version, measured, notes, on_progress, plan.warmup_s
            )
        except Interrupted as interrupted:  # Ctrl-C: the run so far, reported, then the stop
            stop, result, view = interrupted, interrupted.args[0], None
    notes.extend(result.behind)
    scheme, path = ("grpc", target.grpc) if target.grpc else ("http", target.path)
    report = BenchReport(
        model=model,
        version=version,
        url=f"{scheme}://{target.host}:{target.port}{path}",
        settings=_described(endpoints, model, version, notes),
        result=result,
        server=view,
        notes=tuple(notes),
        load={k: getattr(options, k) for k in LOAD_SETTINGS},
    )
    if stop is not None:
        raise Interrupted(report) from None
    return report


def warm_up(gen: LoadGenerator, plan: LoadPlan, seconds: float) -> None:
    """``seconds`` of ``plan``'s load, unmeasured, so the measured run starts on a warm server
    (an open loop at its lowest step's rate); every warm-up of the benchmarks is one of these."""
    if seconds > 0:
        rate = min(r for _, r in plan.steps or ((1, plan.rate),))  # steps: open loop only
        fixed = {"requests": None, "warmup_s": 0.0, "steps": (), "timeline": False}
        try:
            gen.run(replace(plan, duration_s=seconds, rate=rate, **fixed))
        except Interrupted:  # in the warm-up: nothing measured to report
            raise KeyboardInterrupt from None


def window(
    gen: LoadGenerator,
    plan: LoadPlan,
    watch: Callable[[], W],
    on_progress: Callable[[Progress], None] | None = None,
    warmup_s: float = 0.0,
) -> tuple[LoadResult, W, W]:
    """The one measured window: ``warmup_s`` of warm-up first (apart, so the window is the
    measured run's alone), then ``plan`` between two calls of ``watch`` (the server's side of
    the same window: its ``/metrics``, or its process tree's CPU): the result and both watches."""
    warm_up(gen, plan, warmup_s)
    before = watch()
    result = gen.run(plan, on_progress)
    return result, before, watch()


def observe(
    gen: LoadGenerator,
    endpoints: Endpoints,
    model: str,
    version: str | None,
    plan: LoadPlan,
    notes: list[str],
    on_progress: Callable[[Progress], None] | None = None,
    warmup_s: float = 0.0,
) -> tuple[LoadResult, scrape.ServerView | None]:
    """:func:`window` watched by ``/metrics``: the client's result and the server's view of the
    same window (None without a metrics port or when a scrape failed: ``notes`` says why)."""
    snapshot = partial(scrape.snapshot, endpoints.host, endpoints.metrics_port, notes)
    result, before, after = window(gen, plan, snapshot, on_progress, warmup_s)
    view = scrape.server_view(before, after, model, version) if before and after else None
    return result, view


def _management(endpoints: Endpoints) -> Management:
    if endpoints.management_port is None:
        raise BenchError("batch/worker settings need the management API (--management-url)")
    return Management(endpoints.host, endpoints.management_port, endpoints.management_key)


def _described(
    endpoints: Endpoints, model: str, version: str | None, notes: list[str]
) -> dict[str, Any]:
    """The model's batching and worker settings as the management API describes them."""
    if endpoints.management_port is None:
        return {}
    try:
        info = _management(endpoints).describe(model, version)
    except BenchError as exc:
        notes.append(f"cannot describe the model: {exc}")
        return {}
    return {k: info.get(k) for k in QUERY_NAMES}  # the scale query's settings, described


def _ms(summary: LatencySummary, *names: str) -> str:
    """``p50 1.20  p99 3.40``: the named figures of a latency summary."""
    figures = summary.as_dict()
    return "  ".join(f"{name} {num(figures[f'{name}_ms'])}" for name in names)


def format_report(report: BenchReport) -> str:
    """``bench run``'s human table: where and how, then one fact a line, client's then server's."""
    r, s = report.result, report.server
    load = f"concurrency {r.concurrency}" if r.mode == "closed" else f"{r.offered_rate:g} req/s"
    sent = f"{r.sent:,} sent, {r.ok:,} ok, {r.errors:,} errors ({100 * r.error_rate:.2f}%)"
    cpu = ", ".join(f"{c:.0f}%" for c in r.generator_cpu_pct)
    facts = [
        ("requests", f"{sent} in {r.window_s:.2f} s"),
        ("throughput", f"{num(r.req_per_s, 1)} req/s ({num(r.ok_per_s, 1)} ok/s)"),
        ("latency (ms)", _ms(r.latency, "p50", "p90", "p99", "p99.9", "max", "mean")),
        ("statuses", ", ".join(f"{k}: {v:,}" for k, v in r.statuses.items()) or "-"),
        *([("send lag (ms)", _ms(r.lag, "p50", "p99", "max"))] if r.mode == "open" else []),
        ("generator CPU", f"{cpu} of a core per process"),
    ]
    if s is not None:
        handler = "  ".join(f"{k} {num(v)}" for k, v in s.handler_mean_ms.items()) or "-"
        facts += [
            ("server view (from /metrics):", None),
            ("requests", ", ".join(f"{k}: {v:,.0f}" for k, v in s.requests.items()) or "-"),
            ("latency (ms)", f"mean {num(s.request_mean_ms)}  p99~ {num(s.request_p99_ms)}"),
            ("queue (ms)", f"mean {num(s.queue_mean_ms)}  p99~ {num(s.queue_p99_ms)}"),
            ("handler (ms)", handler),
            ("batches", f"{s.batches:,.0f}, mean batch size {num(s.mean_batch_size)}"),
        ]
    loop = "open loop" if r.mode == "open" else "closed loop,"
    lines = [f"{report.url}  ({loop} {load})", f"settings: {report.settings or 'as served'}"]
    lines += [f"load: {report.load}", ""]
    lines += [f"  {k:<13} {v}" if v is not None else k for k, v in facts]
    return "\n".join([*lines, *(f"note: {note}" for note in report.notes)])
