"""The no-HTTP ceiling: samples/s of a scripted model called in a loop (tiny and cnn at batch
1/8/16, as baseline.md's "Model in process" line), timed for a fixed wall time after a short
warm-up, as TorchScript optimises on its first calls. ``--streams N`` sums N loops in threads: the
limit of N single-threaded workers with no server around them."""

from __future__ import annotations

import argparse
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from torchbay.benchmarks.models import SAMPLE_SHAPES


def samples_per_second(
    model: torch.nn.Module, shape: tuple[int, ...], batch: int, seconds: float, streams: int = 1
) -> float:
    """Samples per second of ``streams`` loops of ``model`` on batches of ``batch``, summed."""
    x = torch.randn((batch, *shape), generator=torch.Generator().manual_seed(0))
    barrier = threading.Barrier(streams)  # every loop starts its clock together

    def loop(_: int) -> float:
        barrier.wait()
        with torch.inference_mode():
            for _ in range(5):
                model(x)
            calls, start = 0, time.perf_counter()
            while (now := time.perf_counter()) < start + seconds or not calls:
                model(x)
                calls += 1
        return calls * batch / (now - start)

    with ThreadPoolExecutor(streams) as pool:  # one thread per loop
        return sum(pool.map(loop, range(streams)))


def measure(
    pt_paths: dict[str, str], batches: tuple[int, ...], seconds: float, streams: int = 1
) -> dict[str, dict[int, float]]:
    """``{model: {batch: samples/s}}`` for each scripted model in ``pt_paths``, one intra-op
    thread per loop (a worker's share on a small machine)."""
    torch.set_num_threads(1)
    loaded = {name: torch.jit.load(path).eval() for name, path in pt_paths.items()}
    return {
        name: {b: samples_per_second(m, SAMPLE_SHAPES[name], b, seconds, streams) for b in batches}
        for name, m in loaded.items()
    }


def _pair(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or name not in SAMPLE_SHAPES:
        raise argparse.ArgumentTypeError(f"expected tiny=PATH or cnn=PATH, got {text!r}")
    return name, path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pt", type=_pair, action="append", required=True, help="NAME=PATH")
    parser.add_argument("--batches", default="1,8,16")
    parser.add_argument("--seconds", type=float, default=2.0, help="wall time per batch size")
    parser.add_argument("--streams", type=int, default=1, help="concurrent loops, summed")
    args = parser.parse_args()
    batches = tuple(int(b) for b in args.batches.split(","))
    # One object, {model: {batch: samples/s}}: runner.run_inprocess reads it.
    print(json.dumps(measure(dict(args.pt), batches, args.seconds, args.streams)))
