"""How long a large OIP body that names a priority holds the frontend's event loop: N POSTs of
a 4.5 MB JSON body (one input of 500,000 floats, ``"parameters": {"priority": 1}``) to
/v2/models/tiny/infer, one at a time, while another connection GETs /ping in a loop. Prints the
median over the POSTs of the longest /ping answer during each, and the median POST latency.
The tiny model refuses the body (its input does not fit), after the frontend has read it.

    python results/ab/oip-params-loop-stall.py N

Needs /tmp/ab/tiny.mar (RESULTS.md, "The third robustness hunt's hot-path changes"); starts
the server as big-body-upload.py does."""

import importlib.util
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

_SPEC = importlib.util.spec_from_file_location(
    "upload", Path(__file__).with_name("big-body-upload.py")
)
assert _SPEC is not None and _SPEC.loader is not None
upload = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(upload)


def body() -> bytes:
    tensor = {"name": "x", "datatype": "FP32", "shape": [1, 500_000], "data": [0.5] * 500_000}
    return json.dumps({"parameters": {"priority": 1}, "inputs": [tensor]}).encode()


def pinger(port: int, stop: threading.Event, pings: list[tuple[float, float]]) -> None:
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            start = time.perf_counter()
            client.get(f"http://127.0.0.1:{port}/ping")
            pings.append((start, time.perf_counter()))
            time.sleep(0.002)


def main(count: int) -> None:
    proc, port = upload.serve(Path(tempfile.mkdtemp()))
    data, stop, pings, posts = body(), threading.Event(), [], []
    thread = threading.Thread(target=pinger, args=(port, stop, pings))
    thread.start()
    try:
        with httpx.Client(timeout=60) as client:
            for _ in range(count):
                start = time.perf_counter()
                reply = client.post(f"http://127.0.0.1:{port}/v2/models/tiny/infer", content=data)
                posts.append((start, time.perf_counter()))
                time.sleep(0.05)
    finally:
        stop.set()
        thread.join()
        proc.terminate()
        proc.wait(30)
    longest = [
        max((e - s for s, e in pings if s < end and e > begin), default=0.0) for begin, end in posts
    ]
    ping = statistics.median(longest[1:]) * 1000
    post = statistics.median(e - s for s, e in posts[1:]) * 1000
    print(
        f"status {reply.status_code} longest ping median {ping:.1f} ms, POST median {post:.1f} ms"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]))
