"""``torchbay bench``: ``run`` (one load test) and ``sla`` (the SLA search). Importable without
torch: every verb imports its core lazily."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO, get_args, get_origin

if TYPE_CHECKING:
    from torchbay.benchmarks.loadgen import Progress


def _csv(kind: type) -> Any:
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(v) for v in text.split(",") if v.strip())
        except ValueError:
            msg = f"expected comma-separated numbers, got {text!r}"
            raise argparse.ArgumentTypeError(msg) from None

    return parse


class _Verb(argparse.ArgumentParser):
    """A verb whose flags are built from its options model only when it is parsed, so that every
    other ``torchbay`` command does not import pydantic and numpy to build its parser."""

    populate: Callable[[argparse.ArgumentParser], None] | None = None

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if self.populate is not None:
            populate, self.populate = self.populate, None
            populate(self)
        return super().parse_known_args(args, namespace)


def _flag_kwargs(name: str, info: Any, extra: dict[str, Any]) -> dict[str, Any]:
    """argparse's keywords for the options field ``name``: type, choices and action from its
    annotation, its default, and the help and metavar ``bench.flag`` recorded."""
    kind = info.annotation
    args = [a for a in get_args(kind) if a is not type(None)]
    kw: dict[str, Any] = {"dest": name, "help": info.description}
    if kind is bool:
        return kw | {"action": "store_false" if info.default else "store_true"}
    kw["metavar"] = extra.get("metavar")
    if get_origin(kind) is tuple and args[0] is Path:
        return kw | {"action": "append", "type": Path, "required": True}
    if get_origin(kind) is tuple:
        kw["type"] = _csv(args[0])
    elif get_origin(kind) is Literal:
        kw["choices"] = args
    else:
        kw["type"] = args[0] if args else kind
    if info.is_required():
        return kw | {"required": "group" not in extra}
    return kw | {"default": info.default}


def add_flags(parser: argparse.ArgumentParser, model: Any, **overrides: dict[str, Any]) -> None:
    """One flag per field of ``model`` made with ``bench.flag`` (``--field-name`` unless it names
    its own), the shared load fields last; ``overrides`` replaces a field's keywords (``bench run``
    takes gRPC protocols its options do not)."""
    from torchbay.benchmarks.bench import LoadOptions

    groups: dict[str, Any] = {}
    for name in sorted(model.model_fields, key=lambda n: n in LoadOptions.model_fields):
        info = model.model_fields[name]
        extra = info.json_schema_extra
        if not isinstance(extra, dict) or "flags" not in extra:
            continue
        group = extra.get("group")
        if group and group not in groups:
            groups[group] = parser.add_mutually_exclusive_group(required=True)
        kw = _flag_kwargs(name, info, extra) | overrides.get(name, {})
        flags = extra["flags"] or ("--" + name.replace("_", "-"),)
        groups.get(group, parser).add_argument(*flags, **kw)  # type: ignore[arg-type]


def register(subparsers: Any) -> None:
    bench = subparsers.add_parser(
        "bench", help="load tests and SLA search", description="Load tests and the SLA search."
    )
    verbs = bench.add_subparsers(dest="bench_verb", metavar="COMMAND", parser_class=_Verb)
    bench.set_defaults(func=lambda args: (bench.print_help(), 2)[1])
    run = verbs.add_parser("run", help="one load test (closed or open loop)")
    run.populate = _add_run
    run.set_defaults(func=run_run)
    sla = verbs.add_parser("sla", help="find the configuration with the most traffic under a p99")
    sla.populate = _add_sla
    sla.set_defaults(func=run_sla)


def _add_run(run: argparse.ArgumentParser) -> None:
    from torchbay.benchmarks.bench import RunOptions

    grpc = {
        "choices": ("predict", "v2", "grpc", "grpc-v2"),
        "help": RunOptions.model_fields["protocol"].description
        + "; grpc: TorchServe's gRPC Predictions, beside HTTP; grpc-v2: KServe v2 gRPC "
        "ModelInfer, beside HTTP v2 binary (benchmarks/grpc_pair.py)",
    }
    add_flags(run, RunOptions, protocol=grpc)
    run.add_argument("--json", action="store_true", help="print the result as JSON on stdout")


def _add_sla(sla: argparse.ArgumentParser) -> None:
    from torchbay.benchmarks.sla_model import SlaOptions

    add_flags(sla, SlaOptions)


def _options(model: Any, args: argparse.Namespace) -> Any:
    """``model`` from the parsed flags (each flag's ``dest`` is its field: they cannot drift)."""
    return model(**{k: v for k, v in vars(args).items() if k in model.model_fields})


def _err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _stop_as_ctrl_c() -> None:
    """SIGTERM (a CI's timeout) and SIGHUP (a closed terminal; nohup's ignored one stays so) stop
    a bench as Ctrl-C does: the server it started stops too (it runs in its own session)."""
    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", signal.SIGTERM)):
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, signal.default_int_handler)


def run_run(args: argparse.Namespace) -> int:
    _stop_as_ctrl_c()
    from torchbay.benchmarks import grpc_pair
    from torchbay.benchmarks.bench import RunOptions, run_bench
    from torchbay.benchmarks.loadgen import Interrupted

    pair = args.protocol in ("grpc", "grpc-v2")
    try:
        if pair:
            oip = args.protocol == "grpc-v2"
            args.protocol = "predict"  # the HTTP side of the comparison (grpc-v2 sets its own)
            reports = grpc_pair.run_grpc_bench(_options(RunOptions, args), oip)
        else:
            progress = ProgressLine(None if args.requests else (args.duration_s or 10.0))
            reports = [run_bench(_options(RunOptions, args), progress)]
        status = _all_failed(reports)
    except Interrupted as stop:  # Ctrl-C: the measured part, its report saying so
        reports, status = [stop.args[0]], 130
    dump = [r.as_dict() for r in reports] if pair else reports[0].as_dict()
    text = grpc_pair.format_side_by_side(reports)
    print(json.dumps(dump, indent=2, default=str) if args.json else text)
    return status


def _all_failed(reports: list[Any]) -> int:
    """1, saying why on stderr, when every request of a run failed (a server that refused the
    connections, a wrong model): its figures measure errors, not the server. 0 otherwise."""
    for report in reports:
        r = report.result
        if r.sent and not r.ok:
            statuses = ", ".join(f"{k}: {v:,}" for k, v in r.statuses.items()) or "no answer"
            _err(f"torchbay bench: no request to {report.url} succeeded ({statuses})")
            return 1
    return 0


def run_sla(args: argparse.Namespace) -> int:
    from torchbay.benchmarks.sla import SlaOptions, run_sla

    _stop_as_ctrl_c()
    options = _options(SlaOptions, args)
    if (w := run_sla(options, log=_err).winner) is None:
        print(f"no configuration met p99 <= {options.sla_p99_ms:g} ms; report in {options.out_dir}")
        return 1
    print(f"winner: {w.label} at {w.best_rate:,.1f} req/s with p99 <= {options.sla_p99_ms:g} ms")
    print(f"report: {options.out_dir / 'report.md'}")
    return 0


class ProgressLine:
    """Every few seconds of a run: elapsed seconds, answers so far, the rate since the last line."""

    def __init__(self, total_s: float | None, stream: TextIO = sys.stderr) -> None:
        self.total = f"/{total_s:.0f}" if total_s else ""
        self.stream = stream
        self.last, self.printed = (0.0, 0), 0.0  # the last line's (elapsed, completed), when

    def __call__(self, p: Progress) -> None:
        if time.monotonic() - self.printed < 5.0:
            return
        dt = p.elapsed_s - self.last[0]
        rps = (p.completed - self.last[1]) / dt if dt > 0 else 0.0
        self.last, self.printed = (p.elapsed_s, p.completed), time.monotonic()
        elapsed = f"{max(p.elapsed_s, 0):5.1f}{self.total} s"
        self.stream.write(f"  {elapsed}  {p.completed:,} answered  {rps:,.0f} req/s\n")
        self.stream.flush()


REPO_ROOT = Path(__file__).resolve().parents[1]
