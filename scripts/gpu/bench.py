"""GPU benchmark of the device path (handlers/runtime/accel.py): plain vs its options (VARIANTS),
in process and, with ``--serve``, under ``torchbay serve`` (model-config.yaml's ``handler:
{torchbay: ...}``; ``plain`` is BaseHandler's call before accel).

    .venv/bin/python scripts/gpu/bench.py --models tiny,cnn,wide --batch 8 --seconds 5 [--serve]

One report row: samples/s, p50/p99 ms and the largest difference from ``plain``'s output per
(model, variant, where); ``--json PATH`` writes it. Without CUDA only CPU_VARIANTS run, so the
script stays tested (tests/benchmarks/test_gpu_bench.py).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchbay.benchmarks import models, report, runner
from torchbay.benchmarks.loadgen import LoadGenerator, Target
from torchbay.benchmarks.managed import ManagedServer
from torchbay.benchmarks.report import RowResult
from torchbay.benchmarks.stats import summarize
from torchbay.handlers.runtime import accel

VARIANTS: dict[str, dict[str, Any] | None] = {
    "plain": None,
    "eager": {"channels_last": False},
    "channels_last": {"channels_last": True},
    "fp16": {"channels_last": True, "autocast": "fp16"},
    "graphs": {"channels_last": True, "cuda_graphs": True},
    "fp16_graphs": {"channels_last": True, "autocast": "fp16", "cuda_graphs": True},
}
CPU_VARIANTS = ("plain", "eager", "channels_last")
SHAPES = {**models.SAMPLE_SHAPES, "wide": (3, 128, 128)}
WIDE_BLOCKS = ((64, 1), (128, 2), (256, 2), (256, 1))


def build(name: str) -> nn.Module:
    """A reference model, or ``wide``: the cnn's ResNet at width 64/128/256 on 3x128x128."""
    if name == "wide":
        return models.seeded(lambda: models.SmallResNet(64, WIDE_BLOCKS))
    return models.build(name)


def plain(model: nn.Module, device: torch.device) -> Any:
    """BaseHandler's model call before accel."""
    model = model.to(device)

    def run(x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return model(x.to(device)).cpu()

    return run


def variant_run(name: str, variant: str, device: torch.device, batch: int) -> Any:
    options = VARIANTS[variant]
    if options is None:
        return plain(build(name), device)
    options = accel.AccelOptions(**options)
    return accel.build(build(name).to(device), device, options, batch_size=batch).run


def time_loop(run: Any, x: torch.Tensor, seconds: float) -> list[float]:
    """Per-batch seconds of ``run(x)`` for ``seconds`` (at least 3 batches), after 3 warm-ups."""
    for _ in range(3):
        run(x)
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        t0 = time.perf_counter()
        run(x)
        times.append(time.perf_counter() - t0)
    return times


def inprocess(
    name: str, variants: list[str], device: torch.device, batch: int, seconds: float
) -> dict[str, dict[str, float]]:
    """``{"NAME VARIANT in-process": metrics}`` per variant: samples/s and ms per batch."""
    x = torch.randn(batch, *SHAPES[name], generator=torch.Generator().manual_seed(7))
    reference = plain(build(name), device)(x).float()
    out = {}
    for variant in variants:
        run = variant_run(name, variant, device, batch)
        diff = float((run(x).float().cpu() - reference).abs().max())
        times = time_loop(run, x, seconds)
        latency = summarize(times)
        out[f"{name} {variant} in-process"] = {
            "samples_per_s": len(times) * batch / sum(times),
            "p50_ms": latency.p50_ms,
            "p99_ms": latency.p99_ms,
            "max_abs_diff": diff,
            "errors": 0.0,
        }
    return out


def _archive(name: str, variant: str, batch: int, store: Path, work: Path) -> Path:
    """A .mar of ``name`` (TorchScript, handler_raw.py) whose model-config sets the variant."""
    pt = models.save_scripted(build(name), work / f"{name}.pt")
    (work / "input_shape.json").write_text(json.dumps({"shape": list(SHAPES[name])}))
    config = {"batchSize": batch, "maxBatchDelay": 5, "handler": {"num_threads": 1}}
    config["handler"]["torchbay"] = VARIANTS[variant] or {"enabled": False}
    (work / "model-config.yaml").write_text(json.dumps(config))  # JSON is YAML
    extra = ("--force", "--extra-files", str(work / "input_shape.json"))
    extra += ("--config-file", str(work / "model-config.yaml"))
    return runner.archive(f"{name}_{variant}", pt, store, sys.executable, *extra)


def served(
    name: str, variant: str, batch: int, seconds: float, concurrency: int
) -> dict[str, dict[str, float]]:
    """``torchbay serve`` of the variant's archive under a closed loop (the runner's warm-up and
    measurement, 2 s warm-up at most): ``{"NAME VARIANT serve": metrics}``, per request."""
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        root = Path(tmp)
        (root / "store").mkdir()
        archive = _archive(name, variant, batch, root / "store", root)
        body = torch.randn(*SHAPES[name]).numpy().astype("<f4").tobytes()
        server = ManagedServer.torchbay(archive, root / "run", auth=False, extra_args=("--ncs",))
        with server as endpoints, LoadGenerator() as gen:
            ctx = runner.Ctx(root, runner.Assets({}, {}), gen, seconds, min(seconds, 2.0))
            path = f"/predictions/{archive.stem}"
            target = Target(endpoints.host, endpoints.inference_port, path, (body,), runner.OCTETS)
            load = runner.closed(ctx, target, concurrency)
    figures = (load.req_per_s, load.latency.p50_ms, load.latency.p99_ms, float(load.errors))
    keys = ("samples_per_s", "p50_ms", "p99_ms", "errors")
    return {f"{name} {variant} serve": dict(zip(keys, figures, strict=True))}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/gpu/bench.py", description=__doc__.split("\n")[0])
    p.add_argument("--models", default="tiny,cnn,wide")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--serve", action="store_true", help="also run each variant served")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--json", type=Path, help="write the rows here")
    args = p.parse_args(argv)
    for what, known in (("models", sorted(SHAPES)), ("variants", list(VARIANTS))):
        setattr(args, what, [x for x in getattr(args, what).split(",") if x])
        if unknown := set(getattr(args, what)) - set(known):
            p.error(f"unknown {what} {sorted(unknown)}: want {known}")
    return args


def main(argv: list[str] | None = None) -> RowResult:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda:0" if cuda else "cpu")
    variants = args.variants if cuda else [v for v in args.variants if v in CPU_VARIANTS]
    label = torch.cuda.get_device_name(0) if cuda else "cpu (fallback: no CUDA)"
    settings = f"device: {label}; torch {torch.__version__}; batch {args.batch}"
    print(settings, flush=True)
    row = RowResult("gpu", "The device path, plain vs its options", settings, wide=True)
    for name in args.models:
        measured = inprocess(name, variants, device, args.batch, args.seconds)
        for v in variants if args.serve else ():
            measured |= served(name, v, args.batch, args.seconds, args.concurrency)
        for system, metrics in measured.items():
            row.add(system, metrics)
    head = report.header("", argv, settings, title="GPU benchmark", device=label)
    args_run = sys.argv[1:] if argv is None else argv
    head["command"] = shlex.join(["python", "scripts/gpu/bench.py", *args_run])
    print(report.render([row], head))
    if args.json:
        args.json.write_text(json.dumps(report.as_json([row], head), indent=2))
    return row


if __name__ == "__main__":
    main()
