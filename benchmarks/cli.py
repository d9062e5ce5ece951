"""``torchbay bench``: ``run`` (one load test), ``sla`` (the SLA search), ``scenario`` (a suite).

Importable without torch: every verb imports its core lazily. A suite (``scenarios.SUITES``) runs
here: its archive is built (:func:`build_archive`), each of its scenarios runs with ``bench run``
on a fresh server, and with ``--sla`` its SLA search (:func:`run_suite`); everything lands under
``<out>/scenarios/<suite>/`` (``benchmarks/out/`` by default, gitignored).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchbay.benchmarks.errors import BenchError

if TYPE_CHECKING:
    from torchbay.benchmarks.scenarios import Suite


def _csv(kind: type) -> Any:
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(v) for v in text.split(",") if v.strip())
        except ValueError:
            msg = f"expected comma-separated numbers, got {text!r}"
            raise argparse.ArgumentTypeError(msg) from None

    return parse


def _add_load_args(
    p: argparse.ArgumentParser, protocols: tuple[str, ...] = ("predict", "v2")
) -> None:
    p.add_argument(
        "--input",
        dest="inputs",
        action="append",
        type=Path,
        required=True,
        metavar="FILE",
        help="request body file; repeat for several (cycled in order)",
    )
    p.add_argument("--content-type", help="default: from the file suffix (octet-stream otherwise)")
    p.add_argument(
        "--protocol",
        choices=protocols,
        default="predict",
        help="TorchServe /predictions route or the OIP /v2/models/{m}/infer route"
        + (
            "; grpc: TorchServe's gRPC Predictions, beside HTTP; grpc-v2: KServe v2 gRPC "
            "ModelInfer, beside HTTP v2 binary (benchmarks/grpc_pair.py)"
            if "grpc" in protocols
            else ""
        ),
    )
    p.add_argument(
        "--procs",
        dest="processes",
        type=int,
        default=1,
        metavar="N",
        help="load generator processes (default 1)",
    )


def register(subparsers: Any) -> None:
    bench = subparsers.add_parser(
        "bench", help="load tests and SLA search", description="Load tests and the SLA search."
    )
    verbs = bench.add_subparsers(dest="bench_verb", metavar="COMMAND")
    bench.set_defaults(func=lambda args: (bench.print_help(), 2)[1])
    _add_run(verbs)
    _add_sla(verbs)
    _add_scenario(verbs)


def _add_run(verbs: Any) -> None:
    run = verbs.add_parser("run", help="one load test (closed or open loop)")
    where = run.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server's inference base URL, http://host:port")
    where.add_argument(
        "--archive", type=Path, help="start a server for this .mar and stop it after"
    )
    run.add_argument("--model", help="model name (default: the archive's)")
    run.add_argument("--model-version", dest="version")
    run.add_argument("--token", help="inference API key (Bearer)")
    run.add_argument("--key-file", type=Path, help="the server's key_file.json")
    run.add_argument("--metrics-url", help="with --url: metrics base URL for the server's view")
    run.add_argument("--management-url", help="with --url: management base URL (for settings)")
    run.add_argument("--batch-size", type=int)
    run.add_argument("--max-batch-delay", dest="max_batch_delay_ms", type=float, metavar="MS")
    run.add_argument("--workers", type=int)
    load = run.add_mutually_exclusive_group(required=True)
    load.add_argument("--concurrency", "-c", type=int, help="closed loop with N connections")
    load.add_argument("--rate", "-r", type=float, help="open loop at R requests/s")
    run.add_argument("--arrival", choices=("constant", "poisson"), default="constant")
    run.add_argument(
        "--duration",
        dest="duration_s",
        type=float,
        metavar="S",
        help="measured seconds (default 10)",
    )
    run.add_argument("--requests", "-n", type=int, help="measured requests instead of a duration")
    run.add_argument("--warmup", dest="warmup_s", type=float, default=2.0, metavar="S")
    run.add_argument("--timeout", dest="timeout_s", type=float, default=10.0, metavar="S")
    run.add_argument("--max-connections", type=int, default=1024)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    _add_load_args(run, ("predict", "v2", "grpc", "grpc-v2"))
    run.set_defaults(func=run_run)


def _add_sla(verbs: Any) -> None:
    sla = verbs.add_parser("sla", help="find the configuration with the most traffic under a p99")
    sla.add_argument("--archive", type=Path, required=True)
    sla.add_argument("--sla-p99-ms", type=float, required=True)
    sla.add_argument("--batch-sizes", type=_csv(int), default=(1,), metavar="1,2,4")
    sla.add_argument("--max-delays-ms", type=_csv(float), default=(5.0,), metavar="2,5,10")
    sla.add_argument("--workers", type=_csv(int), default=(1,), metavar="1,2")
    sla.add_argument("--max-error-rate", type=float, default=0.001)
    sla.add_argument("--step", dest="step_s", type=float, default=3.0, metavar="S", help="per step")
    sla.add_argument("--step-warmup", dest="step_warmup_s", type=float, default=0.5, metavar="S")
    sla.add_argument("--probe", dest="probe_s", type=float, default=2.0, metavar="S")
    sla.add_argument("--repeats", type=int, default=3)
    sla.add_argument(
        "--config-warmup",
        dest="config_warmup_s",
        type=float,
        default=2.0,
        metavar="S",
        help="closed-loop warm-up after each reconfiguration",
    )
    sla.add_argument(
        "--min-requests",
        type=int,
        default=200,
        help="lengthen low-rate steps to at least this many requests (max 5 steps)",
    )
    sla.add_argument("--arrival", choices=("constant", "poisson"), default="poisson")
    sla.add_argument(
        "--no-prune", dest="prune", action="store_false", help="search every configuration"
    )
    sla.add_argument(
        "--out", dest="out_dir", type=Path, default=Path("bench-sla"), help="report folder"
    )
    sla.add_argument(
        "--apply",
        action="store_true",
        help="write the winner into the archive's model-config.yaml (original kept as .orig)",
    )
    sla.add_argument("--seed", type=int, default=0)
    sla.add_argument(
        "--no-autopilot",
        dest="autopilot",
        action="store_false",
        help="skip measuring the SLA autopilot (slaP99Ms) at the winner's rate",
    )
    _add_load_args(sla)
    sla.set_defaults(func=run_sla)


def _add_scenario(verbs: Any) -> None:
    scen = verbs.add_parser(
        "scenario", help="run a scenario suite (benchmarks/scenarios.py: tiny, cnn, digits)"
    )
    scen.add_argument("name", help="the suite: tiny, cnn or digits")
    scen.add_argument("--out", type=Path, default=None, help="work folder (default benchmarks/out)")
    scen.add_argument("--sla", action="store_true", help="also run the suite's SLA search")
    scen.add_argument("--duration", type=float, metavar="S", help="override every run's duration")
    scen.add_argument("--warmup", type=float, metavar="S", help="override every run's warm-up")
    scen.add_argument("--json", action="store_true")
    scen.set_defaults(func=run_scenario)


def _options(model: Any, args: argparse.Namespace) -> Any:
    """``model`` (a pydantic options class) from the parsed flags: each flag's ``dest`` is the
    field's name, so the flags and the options cannot drift apart."""
    return model(**{k: v for k, v in vars(args).items() if k in model.model_fields})


def run_run(args: argparse.Namespace) -> int:
    from torchbay.benchmarks.bench import ProgressLine, RunOptions, format_report, run_bench

    if args.protocol in ("grpc", "grpc-v2"):
        from torchbay.benchmarks import grpc_pair

        oip = args.protocol == "grpc-v2"
        args.protocol = "predict"  # the HTTP side of the comparison (grpc-v2 sets its own)
        reports = grpc_pair.run_grpc_bench(_options(RunOptions, args), oip)
        dump = [r.as_dict() for r in reports]
        text = grpc_pair.format_side_by_side(reports)
        print(json.dumps(dump, indent=2, default=str) if args.json else text)
        return 0
    options = _options(RunOptions, args)
    report = run_bench(options, ProgressLine(None if args.requests else (args.duration_s or 10.0)))
    if args.json:
        print(json.dumps(report.as_dict(), indent=2, default=str))
    else:
        print(format_report(report))
    return 0


def run_sla(args: argparse.Namespace) -> int:
    from torchbay.benchmarks.sla import SlaOptions, run_sla

    options = _options(SlaOptions, args)
    result = run_sla(options, log=lambda line: print(line, file=sys.stderr, flush=True))
    if result.winner is None:
        print(f"no configuration met p99 <= {options.sla_p99_ms:g} ms; report in {options.out_dir}")
        return 1
    w = result.winner
    print(f"winner: {w.label} at {w.best_rate:,.1f} req/s with p99 <= {options.sla_p99_ms:g} ms")
    print(f"report: {options.out_dir / 'report.md'}")
    return 0


def run_scenario(args: argparse.Namespace) -> int:
    from torchbay.benchmarks.scenarios import find_suite

    outcome = run_suite(
        find_suite(args.name),
        args.out,
        log=lambda s: print(s, file=sys.stderr, flush=True),
        with_sla=args.sla,
        duration_s=args.duration,
        warmup_s=args.warmup,
    )
    if args.json:
        print(json.dumps(outcome, indent=2, default=str))
    else:
        print(outcome["text"])
    return 0


REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "out"


def _resolve(path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else REPO_ROOT / p


def build_archive(
    suite: Suite, out_dir: Path, log: Callable[[str], None]
) -> tuple[Path, list[Path]]:
    """Make the suite's archive (and bodies, for reference models); returns (archive, inputs)."""
    inputs = [_resolve(p) for p in suite.inputs]
    if suite.archive is None:
        from torchbay.benchmarks import runner

        log(f"building the {suite.model} reference model and archive in {out_dir}")
        assets = runner.archive_models(runner.prepare_models(out_dir), out_dir, sys.executable)
        assert assets.model_store is not None
        return assets.model_store / f"{suite.model}.mar", inputs or [assets.body[suite.model]]
    archive = _resolve(suite.archive)
    if not archive.exists() or any(not p.exists() for p in inputs):
        if suite.script is None:
            raise BenchError(f"{archive} is missing and the suite has no build script")
        log(f"building with {suite.script}")
        proc = subprocess.run(
            [sys.executable, str(_resolve(suite.script))],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise BenchError(f"{suite.script} failed:\n{proc.stderr.strip()[-2000:]}")
    if not inputs:
        raise BenchError(f"suite {suite.name}: give inputs")
    return archive, inputs


def run_suite(
    suite: Suite,
    out_dir: Path | None = None,
    *,
    log: Callable[[str], None] = print,
    with_sla: bool = False,
    duration_s: float | None = None,
    warmup_s: float | None = None,
) -> dict[str, Any]:
    """Build, run every scenario of the suite (a fresh server each) and, with ``with_sla``, the
    search. Returns {"scenario", "runs": [...report dicts], "sla": winner or None, "text"}."""
    from torchbay.benchmarks.bench import format_report, run_bench

    out = (out_dir or DEFAULT_OUT) / "scenarios" / suite.name
    out.mkdir(parents=True, exist_ok=True)
    archive, inputs = build_archive(suite, out.parent.parent, log)
    reports, texts = [], []
    for run in suite.runs:
        log(f"{suite.name}/{run.name}")
        durations = {"duration_s": duration_s, "warmup_s": warmup_s}
        options = suite.run_options(run, archive, inputs, out / run.name, **durations)
        report = run_bench(options)
        reports.append({"name": run.name, **report.as_dict()})
        texts.append(f"== {suite.name}/{run.name}\n{format_report(report)}")
    sla_winner = None
    if with_sla and suite.sla:
        from torchbay.benchmarks.sla import SlaOptions, run_sla

        sla_opts = SlaOptions(
            archive=archive,
            inputs=tuple(inputs),
            out_dir=out / "sla",
            content_type=suite.content_type,
            **suite.sla,
        )
        result = run_sla(sla_opts, log=log)
        sla_winner = result.winner.label if result.winner else None
        texts.append(f"== {suite.name}/sla: winner {sla_winner}; report {out / 'sla'}")
    return {"scenario": suite.name, "runs": reports, "sla": sla_winner, "text": "\n\n".join(texts)}
