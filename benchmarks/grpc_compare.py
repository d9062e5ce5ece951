"""The gRPC table's row (``tables grpc``, issue 12): gRPC beside HTTP for the reference models.

Each cell is one model, protocol pair and concurrency: one run per side on a fresh server, HTTP
then gRPC (``grpc_pair.py``, the closed loop of ``torchbay bench run --protocol grpc``/``grpc-v2``).
``predictions`` is TorchServe's pair (HTTP ``/predictions`` beside gRPC ``Predictions``);
``modelinfer`` and ``tensor`` the Open Inference Protocol pair (HTTP ``/v2/models/{m}/infer`` with
binary tensor data beside gRPC ``ModelInfer`` with ``raw_input_contents``). ``predictions`` and
``modelinfer`` send the raw float32 sample to the benchmark's own archives (``modelinfer``: one
BYTES element); ``tensor`` sends it as a typed FP32 tensor ``[1, ...]`` to the same model packed
with the built-in ``tensor`` handler (Triton's case: binary tensors).
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

from torchbay.benchmarks.report import Ratio, RowResult, ratios
from torchbay.benchmarks.runner import Assets, Cell, Ctx, Row

PAIRS = {
    "predictions": "HTTP /predictions vs gRPC Predictions",
    "modelinfer": "HTTP v2 binary vs gRPC ModelInfer (BYTES body)",
    "tensor": "HTTP v2 binary vs gRPC ModelInfer (FP32 tensor)",
}
Inputs = dict[str, dict[str, tuple[Path, Path]]]  # model -> pair -> (archive, --input file)


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
        archive=archive, inputs=(source,), concurrency=concurrency, run_dir=run_dir, **durations
    )
    sides = [rep.result for rep in run_grpc_bench(options, pair != "predictions")]
    figures = {}
    for side, r in zip(("http", "grpc"), sides, strict=True):
        figures |= {f"{side}_ok_per_s": r.ok_per_s, f"{side}_p50_ms": r.latency.p50_ms}
        figures[f"{side}_p99_ms"] = r.latency.p99_ms
    return figures | {"not_200": float(sum(r.sent - r.ok for r in sides))}


def grpc_row(ctx: Ctx, inputs: Inputs, concurrencies: list[int]) -> Row:
    """A cell per (model, concurrency, pair) of ``inputs``, judged by its gRPC / HTTP ok/s."""
    pairs = {pair for per in inputs.values() for pair in per}
    row = RowResult("grpc", "gRPC beside HTTP", ", ".join(PAIRS[p] for p in pairs), wide=True)
    durations = {"duration_s": ctx.duration_s, "warmup_s": ctx.warmup_s}

    def run(model: str, pair: str, c: int, rnd: int) -> dict[str, dict[str, float]]:
        archive, source = inputs[model][pair]
        run_dir = ctx.out_dir / "runs" / f"{model}-{pair}-c{c}-r{rnd}"
        return {cell(model, pair, c): measure(archive, source, pair, c, run_dir, **durations)}

    estimate = 2 * (ctx.warmup_s + ctx.duration_s) + 6
    cells = [
        Cell((cell(m, p, c),), partial(run, m, p, c), estimate)
        for m, per in inputs.items()
        for c in concurrencies
        for p in per
    ]

    def judge(r: RowResult) -> list[Ratio]:
        def values(name: str) -> list[float]:
            return ratios(r.series(name, "grpc_ok_per_s"), r.series(name, "http_ok_per_s"))

        return [Ratio(f"{name}: gRPC / HTTP ok/s", values(name)) for name in r.systems]

    return Row(row, cells, ("http_ok_per_s",), judge=judge)


def build_inputs(ctx: Ctx, models: list[str], pairs: list[str]) -> Inputs:
    """The archive and ``--input`` file of each model and pair: the run's raw-body archives, and
    for ``tensor`` the model packed with the ``tensor`` handler (its own input)."""
    assert ctx.assets.model_store is not None
    wanted = Assets({m: ctx.assets.pt[m] for m in models}, {m: ctx.assets.body[m] for m in models})
    tensor = "tensor" in pairs
    typed = _tensor_archives(wanted, ctx.out_dir / "model_store_tensor") if tensor else {}
    inputs: Inputs = {}
    for m in models:
        raw = (ctx.assets.model_store / f"{m}.mar", ctx.assets.body[m])
        options = {"predictions": raw, "modelinfer": raw, "tensor": (typed.get(m), typed.get(m))}
        inputs[m] = {pair: options[pair] for pair in pairs}  # type: ignore[misc]
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
