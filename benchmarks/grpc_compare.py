"""gRPC beside HTTP for the reference models, both protocol pairs, in one run (issue 12).

    python -m torchbay.benchmarks.grpc_compare --repeat 3 --duration 10

For each model (tiny, cnn), each concurrency and each repeat, one run per protocol pair on a fresh
server each, HTTP then gRPC (``grpc_pair.py``): ``predictions``, TorchServe's pair (HTTP
``/predictions`` beside gRPC ``Predictions``); ``modelinfer`` and ``tensor``, the Open Inference
Protocol pair (HTTP ``/v2/models/{m}/infer`` with the binary tensor data extension beside gRPC
``ModelInfer`` with ``raw_input_contents``, binary outputs both). Every run is the closed loop of
``torchbay bench run --protocol grpc``/``grpc-v2``; repeats are interleaved (repeat is the outer
loop) so slow drift spreads over every cell. Prints the report's row (``report.RowResult``): per
cell the medians of each side's ok/s, p50 and p99 and the answers that were not 200, and the
gRPC / HTTP ratio of every repeat; ``--json`` adds every run.

Built under ``--out``: the benchmark's own archives (``runner.prepare_models`` /
``archive_models``: the seeded models packed with ``handler_raw.py``), whose requests are the raw
float32 sample body (``modelinfer``: one BYTES element holding it); and for ``tensor`` the same
models packed with the built-in ``tensor`` handler and the sample as the recorded example input,
sent as a typed FP32 tensor ``[1, ...]`` (Triton's case: binary tensors).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from torchbay.benchmarks import report
from torchbay.benchmarks.report import Ratio, RowResult, failed, ratios, render

if TYPE_CHECKING:
    from torchbay.benchmarks.runner import Assets

PAIRS = {
    "predictions": "HTTP /predictions vs gRPC Predictions",
    "modelinfer": "HTTP v2 binary vs gRPC ModelInfer (BYTES body)",
    "tensor": "HTTP v2 binary vs gRPC ModelInfer (FP32 tensor)",
}
Inputs = dict[str, dict[str, tuple[Path, Path]]]  # model -> pair -> (archive, --input file)
DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "grpc_compare"


def cell(model: str, pair: str, concurrency: int) -> str:
    """A system of the report: one model, pair and concurrency (``tiny predictions c=16``)."""
    return f"{model} {pair} c={concurrency}"


def measure(
    archive: Path, source: Path, pair: str, concurrency: int, run_dir: Path, **durations: float
) -> dict[str, float]:
    """One pair's two runs on one fresh server (``source``: the ``--input``; ``durations``:
    ``duration_s`` and ``warmup_s``): each side's ok/s, p50 and p99 (``http_...``, ``grpc_...``)
    and the answers that were not 200."""
    from torchbay.benchmarks.bench import RunOptions
    from torchbay.benchmarks.grpc_pair import run_grpc_bench

    options = RunOptions(
        archive=archive,
        inputs=(source,),
        concurrency=concurrency,
        run_dir=run_dir,
        **durations,
    )
    sides = [rep.result for rep in run_grpc_bench(options, pair != "predictions")]
    figures = {}
    for side, r in zip(("http", "grpc"), sides, strict=True):
        figures |= {f"{side}_ok_per_s": r.ok_per_s, f"{side}_p50_ms": r.latency.p50_ms}
        figures[f"{side}_p99_ms"] = r.latency.p99_ms
    return figures | {"not_200": float(sum(r.sent - r.ok for r in sides))}


def compare(
    inputs: Inputs,
    concurrencies: Sequence[int],
    *,
    repeat: int,
    out: Path,
    log: Callable[[str], None] = print,
    **durations: float,
) -> RowResult:
    """Every (model, concurrency, pair) of ``inputs`` ``repeat`` times (each run ``durations``:
    ``duration_s`` measured after ``warmup_s``), repeat outermost: one system per cell, with its
    gRPC / HTTP ratio; a run that failed is in the row's ``errors``, the others still run."""
    from torchbay.archiver.errors import ArchiveError
    from torchbay.benchmarks.errors import BenchError

    row = RowResult("grpc", "gRPC beside HTTP", ", ".join(PAIRS.values()), wide=True)
    for r in range(1, repeat + 1):
        for model, pairs in inputs.items():
            for c in concurrencies:
                for pair, (archive, source) in pairs.items():
                    name, run_dir = cell(model, pair, c), out / "runs" / f"{model}-{pair}-c{c}-r{r}"
                    log(f"[{r}/{repeat}] {name}")
                    try:
                        row.add(name, measure(archive, source, pair, c, run_dir, **durations))
                    except (BenchError, ArchiveError) as exc:
                        failed(row, name, r, exc, ("http_ok_per_s",))
                        log(f"{name} failed: {row.errors[-1]}")
    for name in row.systems:
        values = ratios(row.series(name, "grpc_ok_per_s"), row.series(name, "http_ok_per_s"))
        row.ratios.append(Ratio(f"{name}: gRPC / HTTP ok/s", values))
    return row


def build_inputs(
    models: Sequence[str], pairs: Sequence[str], out: Path, log: Callable[[str], None]
) -> Inputs:
    """The archives and ``--input`` files of ``models`` for ``pairs``, built under ``out``: the
    benchmark's raw-body archives, and for ``tensor`` the same model packed with the ``tensor``
    handler and its sample as the recorded example input (the archive is its own input)."""
    from torchbay.benchmarks import runner

    log(f"building the reference models and archives in {out}")
    assets = runner.prepare_models(out)
    wanted = runner.Assets(
        pt={m: assets.pt[m] for m in models}, body={m: assets.body[m] for m in models}
    )
    store = runner.archive_models(wanted, out, sys.executable).model_store
    assert store is not None
    typed = _tensor_archives(wanted, out / "model_store_tensor") if "tensor" in pairs else {}
    inputs: Inputs = {}
    for m in models:
        raw = (store / f"{m}.mar", assets.body[m])
        options = {"predictions": raw, "modelinfer": raw}
        if m in typed:
            options["tensor"] = (typed[m], typed[m])
        inputs[m] = {pair: options[pair] for pair in pairs}
    return inputs


def _tensor_archives(assets: Assets, store: Path) -> dict[str, Path]:
    """Each model packed with the built-in ``tensor`` handler (it speaks v2: typed tensors in
    and out) and one sample, batch of 1, recorded as its example input."""
    import numpy as np

    from torchbay.benchmarks import models, runner

    store.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, pt in assets.pt.items():
        example = store / f"{name}-example.npy"
        np.save(example, models.sample_tensor(name).numpy()[None])
        flags = ("--example-input", str(example), "--force")
        out[name] = runner.archive(name, pt, store, sys.executable, *flags, handler="tensor")
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m torchbay.benchmarks.grpc_compare",
        description="gRPC beside HTTP, both protocol pairs",
    )
    p.add_argument("--models", default="tiny,cnn", help="comma-separated (default tiny,cnn)")
    p.add_argument(
        "--pairs",
        default=",".join(PAIRS),
        help=f"comma-separated from {', '.join(PAIRS)} (default all)",
    )
    p.add_argument("--concurrency", "-c", default="16", help="comma-separated (default 16)")
    p.add_argument("--repeat", type=int, default=3, help="runs per cell; the table has medians")
    p.add_argument("--duration", type=float, default=10.0, metavar="S", help="measured seconds")
    p.add_argument("--warmup", type=float, default=2.0, metavar="S")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="work folder")
    p.add_argument("--json", action="store_true", help="print every run as JSON after the table")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from torchbay.benchmarks.models import MODEL_NAMES

    args = _parser().parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    try:
        concurrencies = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        _parser().error(f"--concurrency: expected comma-separated integers: {args.concurrency!r}")
    pairs = [p.strip() for p in args.pairs.split(",") if p.strip()]
    bad = [m for m in models if m not in MODEL_NAMES] + [p for p in pairs if p not in PAIRS]
    if bad or not models or not pairs or not concurrencies or min(concurrencies) < 1:
        _parser().error(
            f"models from {', '.join(MODEL_NAMES)}, pairs from {', '.join(PAIRS)}, concurrency >= 1"
        )
    if args.repeat < 1:
        _parser().error("--repeat must be >= 1")
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    inputs = build_inputs(models, pairs, args.out, log)
    row = compare(
        inputs,
        concurrencies,
        repeat=args.repeat,
        duration_s=args.duration,
        warmup_s=args.warmup,
        out=args.out,
        log=log,
    )
    settings = f"{args.repeat} repeat(s) of {args.duration:g} s after {args.warmup:g} s warm-up"
    head = report.header("grpc_compare", argv, settings, title="gRPC beside HTTP (issue 12)")
    print(render([row], head))
    if args.json:
        print(json.dumps(report.as_json([row], head), indent=2))
    return 1 if row.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
