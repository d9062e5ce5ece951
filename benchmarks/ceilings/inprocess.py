"""The no-HTTP ceiling: samples/s of a scripted model called in a loop, one thread.

    python -m torchbay.benchmarks.ceilings.inprocess --pt tiny=tiny.pt --pt cnn=cnn.pt --json

Each call times ``model(batch)`` under ``torch.inference_mode()`` for a fixed wall time after a
short warm-up (TorchScript profiles and optimises on the first calls), as baseline.md's "Model in
process" line did: tiny at batch 1/8/16, cnn at 1/8/16.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import torch

SAMPLE_SHAPES: dict[str, tuple[int, ...]] = {"tiny": (64,), "cnn": (3, 64, 64)}
DEFAULT_BATCHES = (1, 8, 16)


def samples_per_second(
    model: torch.jit.ScriptModule | torch.nn.Module,
    shape: tuple[int, ...],
    batch: int,
    *,
    seconds: float = 2.0,
    warmup_calls: int = 5,
) -> float:
    """Samples per second of ``model`` on a batch of ``batch`` samples of ``shape``."""
    x = torch.randn((batch, *shape), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        for _ in range(warmup_calls):
            model(x)
        calls = 0
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            model(x)
            calls += 1
            now = time.perf_counter()
            if now >= deadline:
                break
    return calls * batch / (now - start)


def streams_samples_per_second(
    model: torch.jit.ScriptModule | torch.nn.Module,
    shape: tuple[int, ...],
    batch: int,
    streams: int,
    *,
    seconds: float = 2.0,
) -> float:
    """Samples per second of ``streams`` threads each calling ``model`` in its own loop (the
    limit of ``streams`` single-threaded workers with no server around them), summed."""
    rates = [0.0] * streams
    barrier = threading.Barrier(streams)

    def stream(i: int) -> None:
        barrier.wait()
        rates[i] = samples_per_second(model, shape, batch, seconds=seconds)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(rates)


def measure(
    pt_paths: dict[str, str],
    batches: tuple[int, ...] = DEFAULT_BATCHES,
    *,
    seconds: float = 2.0,
    threads: int = 1,
    streams: int = 1,
) -> dict[str, dict[int, float]]:
    """``{model: {batch: samples/s}}`` for each scripted model in ``pt_paths``; ``streams`` > 1
    sums that many concurrent single-model loops (threads of ``threads`` intra-op threads)."""
    torch.set_num_threads(threads)
    results: dict[str, dict[int, float]] = {}
    for name, path in pt_paths.items():
        model = torch.jit.load(path).eval()
        shape = SAMPLE_SHAPES[name]
        if streams > 1:
            results[name] = {
                b: streams_samples_per_second(model, shape, b, streams, seconds=seconds)
                for b in batches
            }
        else:
            results[name] = {
                b: samples_per_second(model, shape, b, seconds=seconds) for b in batches
            }
    return results


def _pair(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or name not in SAMPLE_SHAPES:
        raise argparse.ArgumentTypeError(f"expected tiny=PATH or cnn=PATH, got {text!r}")
    return name, path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pt", type=_pair, action="append", required=True, help="NAME=PATH")
    parser.add_argument("--batches", default=",".join(map(str, DEFAULT_BATCHES)))
    parser.add_argument("--seconds", type=float, default=2.0, help="wall time per batch size")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--streams", type=int, default=1, help="concurrent loops, summed")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    batches = tuple(int(b) for b in args.batches.split(","))
    results = measure(
        dict(args.pt), batches, seconds=args.seconds, threads=args.threads, streams=args.streams
    )
    if args.json:
        print(json.dumps(results))
    else:
        for name, per_batch in results.items():
            for batch, rate in per_batch.items():
                print(f"{name:5s} batch {batch:3d}: {rate:12,.0f} samples/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
