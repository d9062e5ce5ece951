"""gRPC beside HTTP for the reference models, both protocol pairs, in one run (issue 12).

    python -m torchbay.benchmarks.grpc_compare --repeat 3 --duration 10

For each model (tiny, cnn), each concurrency and each repeat, one run per protocol pair on a fresh
server each, HTTP then gRPC (``grpc_pair.py``): ``predictions``, TorchServe's pair (HTTP
``/predictions`` beside gRPC ``Predictions``); ``modelinfer`` and ``tensor``, the Open Inference
Protocol pair (HTTP ``/v2/models/{m}/infer`` with the binary tensor data extension beside gRPC
``ModelInfer`` with ``raw_input_contents``, binary outputs both). Every run is the closed loop of
``torchbay bench run --protocol grpc``/``grpc-v2``; repeats are interleaved (repeat is the outer
loop) so slow drift spreads over every cell. Prints one markdown table of the medians: req/s
(answered 200) of HTTP and gRPC, their ratio, and p50/p99 of each; ``--json`` adds every run.

Built under ``--out``: the benchmark's own archives (``runner.prepare_models`` /
``archive_models``: the seeded models packed with ``handler_raw.py``), whose requests are the raw
float32 sample body (``modelinfer``: one BYTES element holding it); and for ``tensor`` the same
models packed with the built-in ``tensor`` handler and the sample as the recorded example input,
sent as a typed FP32 tensor ``[1, ...]`` (Triton's case: binary tensors).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchbay.benchmarks.report import markdown_table, num

if TYPE_CHECKING:
    from torchbay.benchmarks.loadplan import LoadResult
    from torchbay.benchmarks.runner import Assets

PAIRS = {
    "predictions": "HTTP /predictions vs gRPC Predictions",
    "modelinfer": "HTTP v2 binary vs gRPC ModelInfer (BYTES body)",
    "tensor": "HTTP v2 binary vs gRPC ModelInfer (FP32 tensor)",
}
Inputs = dict[str, dict[str, tuple[Path, Path]]]  # model -> pair -> (archive, --input file)
DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "grpc_compare"


# One run of one pair (a "sample"): model, pair, concurrency, repeat, and each side's ok_per_s,
# p50_ms, p99_ms, sent and ok, prefixed http_ and grpc_.
Sample = dict[str, Any]


def measure(
    model: str,
    archive: Path,
    source: Path,
    pair: str,
    concurrency: int,
    repeat: int,
    *,
    duration_s: float,
    warmup_s: float,
    run_dir: Path,
) -> Sample:
    """One pair's two reports on one fresh server (``source``: the ``--input``)."""
    from torchbay.benchmarks.bench import RunOptions

    options = RunOptions(
        archive=archive,
        inputs=(source,),
        concurrency=concurrency,
        duration_s=duration_s,
        warmup_s=warmup_s,
        run_dir=run_dir,
    )
    from torchbay.benchmarks.grpc_pair import run_grpc_bench

    http, grpc_ = (report.result for report in run_grpc_bench(options, pair != "predictions"))
    sides = {**_side("http", http), **_side("grpc", grpc_)}
    return {"model": model, "pair": pair, "concurrency": concurrency, "repeat": repeat, **sides}


def _side(protocol: str, result: LoadResult) -> dict[str, Any]:
    """One protocol's half of a sample (its fields are named ``<protocol>_...``)."""
    figures = {
        "ok_per_s": result.ok_per_s,
        "p50_ms": result.latency.p50_ms,
        "p99_ms": result.latency.p99_ms,
        "sent": result.sent,
        "ok": result.ok,
    }
    return {f"{protocol}_{name}": value for name, value in figures.items()}


def compare(
    inputs: Inputs,
    concurrencies: Sequence[int],
    *,
    repeat: int,
    duration_s: float,
    warmup_s: float,
    out: Path,
    log: Callable[[str], None] = print,
) -> tuple[list[Sample], list[str]]:
    """Every (model, concurrency, pair) of ``inputs`` ``repeat`` times: (the samples, one line
    per run that failed; the others still run)."""
    from torchbay.archiver.errors import ArchiveError
    from torchbay.benchmarks.errors import BenchError

    samples, failures = [], []
    for r in range(repeat):
        for model, pairs in inputs.items():
            for c in concurrencies:
                for pair, (archive, source) in pairs.items():
                    cell = f"[{r + 1}/{repeat}] {model} {pair} c={c}"
                    log(cell)
                    run_dir = out / "runs" / f"{model}-{pair}-c{c}-r{r}"
                    run_dir.mkdir(parents=True, exist_ok=True)
                    try:
                        samples.append(
                            measure(
                                model,
                                archive,
                                source,
                                pair,
                                c,
                                r,
                                duration_s=duration_s,
                                warmup_s=warmup_s,
                                run_dir=run_dir,
                            )
                        )
                    except (BenchError, ArchiveError) as exc:
                        failures.append(f"{cell} failed: {exc}")
                        log(failures[-1])
    return samples, failures


def _median(samples: list[Sample], field: str) -> float:
    return statistics.median(s[field] for s in samples)


def table(samples: Sequence[Sample]) -> str:
    """One markdown row per (model, pair, concurrency): the medians over its repeats."""
    cells: dict[tuple[str, str, int], list[Sample]] = {}
    for s in samples:
        cells.setdefault((s["model"], s["pair"], s["concurrency"]), []).append(s)
    rows = []
    for (model, pair, c), group in cells.items():
        http, grpc_ = _median(group, "http_ok_per_s"), _median(group, "grpc_ok_per_s")
        failed = sum(s["http_sent"] - s["http_ok"] + s["grpc_sent"] - s["grpc_ok"] for s in group)
        rows.append(
            [
                model,
                PAIRS[pair],
                str(c),
                str(len(group)),
                num(http, 1),
                num(grpc_, 1),
                num(grpc_ / http if http else None, 2),
                f"{num(_median(group, 'http_p50_ms'))} / {num(_median(group, 'http_p99_ms'))}",
                f"{num(_median(group, 'grpc_p50_ms'))} / {num(_median(group, 'grpc_p99_ms'))}",
                str(failed),
            ]
        )
    header = [
        "model",
        "pair",
        "c",
        "runs",
        "HTTP req/s",
        "gRPC req/s",
        "gRPC/HTTP",
        "HTTP p50 / p99 ms",
        "gRPC p50 / p99 ms",
        "not 200",
    ]
    return markdown_table(header, rows, align="--::::::::")


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
    samples, failures = compare(
        inputs,
        concurrencies,
        repeat=args.repeat,
        duration_s=args.duration,
        warmup_s=args.warmup,
        out=args.out,
        log=log,
    )
    print(table(samples))
    for line in failures:
        print(f"\n{line}")
    if args.json:
        print(json.dumps(samples, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
