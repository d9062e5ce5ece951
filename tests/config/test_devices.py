from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from torchbay.server.errors import ConfigError
from torchbay.server.serving.devices import DeviceAssigner, detect_gpu_count


def physical(n: int) -> Callable[[Mapping[str, str]], int]:
    """A stand-in for the hardware probe (the I/O seam)."""

    def probe(env: Mapping[str, str]) -> int:
        return n

    return probe


@pytest.mark.parametrize(
    ("mask", "count", "expected"),
    [
        (None, 4, 4),
        ("", 4, 0),
        ("-1", 4, 0),
        ("0,1", 4, 2),
        ("2", 4, 1),
        ("0,1,2,3,4,5", 2, 2),  # more entries than GPUs
        ("0,-1,2", 4, 1),  # CUDA stops at the first invalid entry
        ("GPU-8d1c, GPU-77aa", 4, 2),
        ("0,1", 0, 0),
        # As CUDA (and torch's _parse_visible_devices) read it, so that no worker is given an
        # ordinal its CUDA does not have ("invalid device ordinal" at every load):
        ("0,5", 2, 1),  # an ordinal past the physical GPUs ends the list
        ("5,0", 2, 0),
        ("0,0", 2, 0),  # a repeated ordinal hides every GPU
        ("1,0,1", 2, 0),
        ("GPU-8d1c,GPU-8d1c", 4, 0),
        ("1gpu", 2, 1),  # strtoul: the leading digits
        (" 1 , 0 ", 2, 2),
        ("x,0", 2, 0),
    ],
)
def test_detect_gpu_count_honours_cuda_visible_devices(
    mask: str | None, count: int, expected: int
) -> None:
    env = {} if mask is None else {"CUDA_VISIBLE_DEVICES": mask}
    assert detect_gpu_count(env, physical=physical(count)) == expected


def test_hidden_gpus_are_not_probed() -> None:
    def probe(env: Mapping[str, str]) -> int:
        raise AssertionError("probed although CUDA_VISIBLE_DEVICES hides every GPU")

    assert detect_gpu_count({"CUDA_VISIBLE_DEVICES": "-1"}, physical=probe) == 0


def test_detect_via_nvidia_smi_on_path(tmp_path: Path) -> None:
    # A stand-in nvidia-smi executable: the real probe runs it through PATH from the passed env.
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        "echo 'GPU 0: NVIDIA H100 (UUID: GPU-a)'\n"
        "echo '  MIG 1g.10gb Device 0: (UUID: MIG-b)'\n"
        "echo 'GPU 1: NVIDIA H100 (UUID: GPU-c)'\n"
    )
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    env = {"PATH": str(tmp_path)}
    try:
        import pynvml  # noqa: F401
    except ImportError:
        assert detect_gpu_count(env) == 2
        assert detect_gpu_count({**env, "CUDA_VISIBLE_DEVICES": "1"}) == 1
    else:  # NVML answers first where it is installed; the count must still be sane
        assert detect_gpu_count(env) >= 0


def test_no_gpu_tooling_means_zero(tmp_path: Path) -> None:
    try:
        import pynvml  # noqa: F401
    except ImportError:
        assert detect_gpu_count({"PATH": str(tmp_path)}) == 0
    else:
        pytest.skip("pynvml installed: NVML decides")


def test_global_round_robin_two_models_two_gpus() -> None:
    devices = DeviceAssigner(gpu_count=2)
    got = [
        devices.assign("a/1.0", "auto", None),
        devices.assign("a/1.0", "gpu", None),
        devices.assign("b/1.0", "auto", None),
        devices.assign("a/1.0", "auto", None),
        devices.assign("b/1.0", "gpu", None),
    ]
    # One counter over all workers of all models, starting at GPU 0 (TorchServe starts at 1).
    assert got == [0, 1, 0, 1, 0]


def test_global_round_robin_three_gpus_interleaved_models() -> None:
    devices = DeviceAssigner(gpu_count=3)
    a = [devices.assign("a/1", "auto", None) for _ in range(2)]
    b = [devices.assign("b/1", "auto", None) for _ in range(2)]
    c = devices.assign("a/2", "auto", None)
    assert (a, b, c) == ([0, 1], [2, 0], 1)


def test_device_ids_use_a_per_model_counter() -> None:
    devices = DeviceAssigner(gpu_count=4)
    assert devices.assign("g/1", "auto", None) == 0
    pinned = [devices.assign("p/1", "gpu", [3, 1]) for _ in range(3)]
    assert pinned == [3, 1, 3]
    other = [devices.assign("q/1", "gpu", [2]) for _ in range(2)]
    assert other == [2, 2]
    # The pinned models did not move the global counter.
    assert devices.assign("g/1", "auto", None) == 1
    devices.forget("p/1")
    assert devices.assign("p/1", "gpu", [3, 1]) == 3


def test_cpu_and_no_gpu_mean_none() -> None:
    assert DeviceAssigner(2).assign("m/1", "cpu", [0, 1]) is None
    assert DeviceAssigner(0).assign("m/1", "auto", None) is None
    assert DeviceAssigner(0).assign("m/1", "auto", [0]) is None


def test_gpu_required_without_gpu_runs_on_the_cpu(caplog: pytest.LogCaptureFixture) -> None:
    # TorchServe's Model: deviceType gpu where number_of_gpu is 0 is the CPU (its record:
    # tests/data/torchserve/devices/answers.json); said once per model, not per worker.
    devices = DeviceAssigner(0)
    assert [devices.assign("m/1", "gpu", None) for _ in range(3)] == [None] * 3
    assert devices.assign("m/1", "gpu", [0]) is None
    assert [r.getMessage() for r in caplog.records] == [
        "model m/1: deviceType gpu, but no GPU is visible: CPU"
    ]


def test_device_ids_out_of_range() -> None:
    with pytest.raises(ConfigError, match=r"deviceIds \[2\]"):
        DeviceAssigner(2).assign("m/1", "gpu", [0, 2])


def test_real_probe_runs_without_torch() -> None:
    # On this machine (no GPU) or a GPU host: a non-negative count, no exception.
    assert detect_gpu_count(dict(os.environ)) >= 0
