"""In-process latency of one model call: eager vs TorchScript frozen vs torch.export vs AOTI.

    .venv/bin/python results/aoti/compare.py [--models tiny,cnn] [--batches 1,8]
        [--runs 5] [--iters 200] [--threads 1]

The script behind docs/aoti.md's table ("Where it wins"); it was ``benchmarks/aoti_compare.py``
(``python -m benchmarks.aoti_compare``) when that table was measured. It needs torchbay installed
(the models come from ``torchbay.benchmarks.models``) and a C++ compiler for the AOTI package.

For each model (torchbay.benchmarks.models) and batch size: the median over ``--runs`` short runs of
the mean time per call (``--iters`` calls after warm-up), for
  eager        the nn.Module in eval + inference_mode;
  ts-frozen    torch.jit.script + torch.jit.freeze + torch.jit.optimize_for_inference
               (what ``--convert torchscript-script --optimize`` serves);
  export       torch.export with a dynamic batch, ``.module()`` (``--convert export``);
  aoti         the AOTInductor package of ``--convert aoti`` (dynamic batch, freezing), loaded
               exactly as the worker loads it (handlers.runtime.aoti_loader.load_aoti).
It also prints each conversion's time (the AOTI compile dominates: tens of seconds on 2 cores).
Threads: ``--threads`` intra-op (1 = a worker's default share on a small box), inter-op 1.
Timings on a loaded machine are noise: compare rows of ONE run, and re-run on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from torchbay.benchmarks.models import SAMPLE_SHAPES, build


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _variants(name: str, work: Path) -> tuple[dict[str, Callable[..., Any]], dict[str, float]]:
    from torchbay.archiver.aoti import compile_package
    from torchbay.handlers.runtime.aoti_loader import load_aoti

    model = build(name).eval()
    example = torch.randn(2, *SAMPLE_SHAPES[name])
    compile_s: dict[str, float] = {}
    with torch.no_grad():
        frozen, compile_s["ts-frozen"] = _timed(
            lambda: torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.script(model)))
        )
        batch = torch.export.Dim("batch", min=1, max=1024)
        program, compile_s["export"] = _timed(
            lambda: torch.export.export(model, (example,), dynamic_shapes=({0: batch},))
        )
    pkg = work / f"{name}.pt2"
    _, compile_s["aoti"] = _timed(lambda: compile_package(model, example, pkg))
    variants = {
        "eager": model,
        "ts-frozen": frozen,
        "export": program.module(),
        "aoti": load_aoti(pkg, torch.device("cpu")),
    }
    return variants, compile_s


def _median_ms(fn: Callable[..., Any], x: torch.Tensor, runs: int, iters: int) -> float:
    means = []
    with torch.inference_mode():
        for _ in range(10):
            fn(x)
        for _ in range(runs):
            start = time.perf_counter()
            for _ in range(iters):
                fn(x)
            means.append((time.perf_counter() - start) / iters * 1e3)
    return statistics.median(means)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny,cnn")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    batches = [int(b) for b in args.batches.split(",")]
    print(f"torch {torch.__version__}, {args.threads} intra-op thread(s), median of {args.runs}")
    print(f"{'model':6} {'batch':>5} " + " ".join(f"{v:>10}" for v in _NAMES) + "  (ms/call)")
    with tempfile.TemporaryDirectory(prefix="aoti-compare-") as tmp:
        for name in args.models.split(","):
            variants, compile_s = _variants(name, Path(tmp))
            for b in batches:
                x = torch.randn(b, *SAMPLE_SHAPES[name])
                row = [_median_ms(variants[v], x, args.runs, args.iters) for v in _NAMES]
                print(f"{name:6} {b:>5} " + " ".join(f"{ms:>10.3f}" for ms in row))
            times = ", ".join(f"{k} {s:.1f} s" for k, s in compile_s.items())
            print(f"{name:6} conversion time: {times}")
    return 0


_NAMES = ("eager", "ts-frozen", "export", "aoti")

if __name__ == "__main__":
    raise SystemExit(main())
