"""CUDA shared memory on a GPU host, in one go (issue 28): what the CPU-only suite cannot run.

    .venv/bin/python scripts/gpu/cuda_shm_check.py [--rounds 3 --requests 10] [--skip-tests]

1. The tests that need a GPU: tests/handlers/test_cuda_ipc.py (the real ctypes seam across two
   processes) and the cudashm programs of tests/examples/test_triton_examples.py.
2. Triton's own simple_http_cudashm_client.py and simple_grpc_cudashm_client.py (vendored in
   tests/third_party/triton_client_examples/), unchanged, against ``torchbay serve`` of
   examples/triton's ``simple`` on the GPU (they need cuda-python, as tritonclient's
   cuda_shared_memory does: reported as SKIP without it).
3. Latency of a 16 MiB FP32 input and its 16 MiB output at c=1 (results/shm/latency.py's
   ``plus1`` model and its four modes), with two more modes: ``http+cuda`` and ``grpc+cuda``,
   the input and output in two registered CUDA regions (device memory the client allocated with
   cudaMalloc and exported with cudaIpcGetMemHandle through torch's CUDA runtime, our seam's
   library). Their time includes the client copying its input from its own device tensor into
   the region and the output out of it (device-to-device), as the system modes' include
   ``np.copyto`` both ways.
4. Unregistering gives the memory back: a 1 GiB region used by one request, unregistered and
   freed by the client; the GPU's free memory must come back (the worker closes its IPC handle
   at the unregister, not at its next request).

Exit status 0 when every step passed. It needs a GPU; it was written without one (read, not run).
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import importlib.util
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = REPO / "tests" / "third_party" / "triton_client_examples"
EXAMPLES = ("simple_http_cudashm_client.py", "simple_grpc_cudashm_client.py")


def _by_path(path: Path, name: str):
    """A module of a folder that is not a package (results/, examples/), imported by path."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


def run_tests() -> bool:
    tests = ["tests/handlers/test_cuda_ipc.py", "tests/examples/test_triton_examples.py"]
    command = [sys.executable, "-m", "pytest", *tests, "-k", "cuda", "-q", "-rs"]
    command += ["-p", "no:cacheprovider"]
    print("$", " ".join(command), flush=True)
    return subprocess.run(command, cwd=REPO, check=False).returncode == 0


def run_examples(latency, work: Path) -> bool:
    """Triton's cudashm programs against ``simple`` served on the GPU."""
    if importlib.util.find_spec("cuda") is None:
        print("SKIP Triton's cudashm programs: cuda-python (cuda.bindings) is not installed")
        return True
    builder = _by_path(REPO / "examples/triton/build_models.py", "triton_build_models")
    store = work / "triton"
    archive = builder.build_one("simple", builder.SPECS["simple"], work / "triton-work", store)
    server = latency.ManagedServer.torchbay(
        archive, work / "run-simple", auth=False, extra_args=("--allow-client-shm",)
    )
    ok = True
    with server as ports:
        for script in EXAMPLES:
            port = ports.grpc_port if "grpc" in script else ports.inference_port
            done = subprocess.run(
                [sys.executable, str(PROGRAMS / script), "-u", f"127.0.0.1:{port}"],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            passed = done.returncode == 0 and "PASS" in done.stdout
            ok &= passed
            print(f"{'PASS' if passed else 'FAIL'} {script} (exit {done.returncode})")
            if not passed:
                print((done.stdout + done.stderr)[-3000:])
    return ok


class DeviceRegion:
    """``nbytes`` of device memory from cudaMalloc (never torch's caching allocator, whose
    blocks hold several tensors), its IPC handle, and a tensor over it."""

    def __init__(self, nbytes: int) -> None:
        from torchbay.handlers.runtime import cuda_ipc

        lib = cuda_ipc._cudart()
        lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        lib.cudaIpcGetMemHandle.argtypes = [ctypes.POINTER(cuda_ipc.IpcMemHandle), ctypes.c_void_p]
        lib.cudaFree.argtypes = [ctypes.c_void_p]
        self.lib, self.ptr = lib, ctypes.c_void_p()
        assert lib.cudaMalloc(ctypes.byref(self.ptr), nbytes) == 0, "cudaMalloc failed"
        handle = cuda_ipc.IpcMemHandle()
        assert lib.cudaIpcGetMemHandle(ctypes.byref(handle), self.ptr) == 0
        self.raw_handle = base64.b64encode(bytes(handle))
        address = int(self.ptr.value or 0)
        self.tensor = cuda_ipc.tensor_at(address, 0, nbytes, torch.float32, [1, nbytes // 4], 0)

    def free(self) -> None:
        torch.cuda.synchronize()
        self.lib.cudaFree(self.ptr)


def cuda_modes(latency, ports, regions: dict) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    """``http+cuda`` and ``grpc+cuda``: the input and output in two registered CUDA regions."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    n, nbytes = latency.N, latency.NBYTES
    http = httpclient.InferenceServerClient(
        f"127.0.0.1:{ports.inference_port}", connection_timeout=120, network_timeout=120
    )
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{ports.grpc_port}")
    http.unregister_cuda_shared_memory()
    for name in ("cuda_in", "cuda_out"):
        regions[name] = DeviceRegion(nbytes)
        http.register_cuda_shared_memory(name, regions[name].raw_handle, 0, nbytes)
    mine: dict[int, torch.Tensor] = {}  # the client's own device copy of each input

    def shared(module, client) -> Callable[[np.ndarray], OnDevice]:
        def run(x: np.ndarray) -> OnDevice:
            source = mine.setdefault(id(x), torch.from_numpy(x).cuda())
            regions["cuda_in"].tensor.copy_(source)
            torch.cuda.synchronize()  # the input is in the region before the server reads it
            inp = module.InferInput("INPUT0", [1, n], "FP32")
            inp.set_shared_memory("cuda_in", nbytes)
            out = module.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory("cuda_out", nbytes)
            client.infer("plus1", [inp], outputs=[out])
            result = regions["cuda_out"].tensor.clone()
            torch.cuda.synchronize()
            return OnDevice(result)

        return run

    return {"http+cuda": shared(httpclient, http), "grpc+cuda": shared(grpcclient, grpc)}


class OnDevice:
    """A result the client keeps on its GPU; brought to the host only when checked
    (``np.asarray``), so the timed requests do not pay a copy the other modes do not."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self.tensor.cpu().numpy()


def run_latency(latency, work: Path, rounds: int, requests: int) -> bool:
    import tritonclient.utils.shared_memory as shm

    store = work / "plus1"
    store.mkdir()
    latency.build_archive(store, work)
    regions: dict = {}
    with latency.serving(store, work) as ports:
        runs, system = latency.modes(ports)
        try:
            runs.update(cuda_modes(latency, ports, regions))
            times = latency.measure(runs, rounds, requests)
            released = check_release(latency, ports)
        finally:
            for handle in system.values():
                shm.destroy_shared_memory_region(handle)
            for region in regions.values():
                region.free()
    latency.report(times, argparse.Namespace(rounds=rounds, requests=requests))
    for proto in ("http", "grpc"):
        med = {k: float(np.median(v)) for k, v in times.items()}
        print(f"{proto}: binary / cuda = {med[proto] / med[proto + '+cuda']:.1f}x")
    return released


def check_release(latency, ports, size: int = 1 << 30, timeout_s: float = 5.0) -> bool:
    """Step 4: the GPU's free memory is back within ``timeout_s`` of a ``size`` region's
    unregister and cudaFree (the worker mapped it for one request)."""
    import time

    import tritonclient.http as httpclient

    http = httpclient.InferenceServerClient(f"127.0.0.1:{ports.inference_port}")
    torch.cuda.synchronize()
    before = torch.cuda.mem_get_info()[0]
    big, out = DeviceRegion(size), DeviceRegion(latency.NBYTES)
    http.register_cuda_shared_memory("big_in", big.raw_handle, 0, size)
    http.register_cuda_shared_memory("big_out", out.raw_handle, 0, latency.NBYTES)
    inp = httpclient.InferInput("INPUT0", [1, latency.N], "FP32")
    inp.set_shared_memory("big_in", latency.NBYTES)
    output = httpclient.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory("big_out", latency.NBYTES)
    http.infer("plus1", [inp], outputs=[output])
    for name in ("big_in", "big_out"):
        http.unregister_cuda_shared_memory(name)
    big.free()
    out.free()
    deadline = time.monotonic() + timeout_s
    while (after := torch.cuda.mem_get_info()[0]) < before - (64 << 20):
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    ok = after >= before - (64 << 20)
    mib = 1 << 20
    print(
        f"{'PASS' if ok else 'FAIL'} release: GPU free {before // mib} MiB before a "
        f"{size // mib} MiB region, {after // mib} MiB after its unregister and cudaFree"
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=10, help="per mode and round")
    parser.add_argument("--skip-tests", action="store_true", help="only steps 2 and 3")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU here: this check needs one", file=sys.stderr)
        return 2
    print(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}", flush=True)
    ok = args.skip_tests or run_tests()
    latency = _by_path(REPO / "results/shm/latency.py", "shm_latency")
    with tempfile.TemporaryDirectory() as tmp:
        ok &= run_examples(latency, Path(tmp))
        ok &= run_latency(latency, Path(tmp), args.rounds, args.requests)
    print("ALL PASSED" if ok else "SOME STEPS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
