"""Host and GPU metrics under TorchServe's names, read at scrape time (never on a timer).

Host (``Level="Host"``, ``Hostname``), through psutil:

    CPUUtilization, MemoryUtilization, DiskUtilization   percent
    MemoryUsed, MemoryAvailable                          megabytes
    DiskUsage, DiskAvailable                             gigabytes (of the root filesystem)

GPU (``Level="Host"``, ``DeviceId``, ``Hostname``), through NVML (``pynvml`` from the optional
``nvidia-ml-py``); no NVML, no driver or no device means no GPU series at all:

    GPUUtilization, GPUMemoryUtilization   percent
    GPUMemoryUsed                          megabytes

``DeviceId`` is NVML's index (physical order, not renumbered by ``CUDA_VISIBLE_DEVICES``).
CPU utilisation is ``psutil.cpu_percent(interval=None)``: the average since the previous scrape,
so a scrape never sleeps. Torch-free.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import psutil
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger("torchbay.metrics")

MB = 1024 * 1024
GB = 1024 * MB
HOST_METRICS = (
    "CPUUtilization",
    "MemoryUtilization",
    "MemoryUsed",
    "MemoryAvailable",
    "DiskUtilization",
    "DiskUsage",
    "DiskAvailable",
)
GPU_METRICS = ("GPUUtilization", "GPUMemoryUtilization", "GPUMemoryUsed")
HOST_LABELS = ("Level", "Hostname")
GPU_LABELS = ("Level", "DeviceId", "Hostname")


def _gauge(name: str, doc: str, labels: tuple[str, ...]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


class HostCollector(Collector):
    """CPU, memory and disk of this machine, as TorchServe's ``metric_collector`` reports them."""

    def __init__(self, hostname: str, disk_path: str = "/") -> None:
        self.hostname = hostname
        self.disk_path = disk_path
        psutil.cpu_percent(interval=None)  # prime: the first call has no interval to measure

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def _families(self) -> list[GaugeMetricFamily]:
        return [
            _gauge(
                "CPUUtilization", "CPU utilization since the last scrape (percent)", HOST_LABELS
            ),
            _gauge("MemoryUtilization", "Memory utilization (percent)", HOST_LABELS),
            _gauge("MemoryUsed", "Memory used (megabytes)", HOST_LABELS),
            _gauge("MemoryAvailable", "Memory available (megabytes)", HOST_LABELS),
            _gauge("DiskUtilization", "Root disk utilization (percent)", HOST_LABELS),
            _gauge("DiskUsage", "Root disk used (gigabytes)", HOST_LABELS),
            _gauge("DiskAvailable", "Root disk available (gigabytes)", HOST_LABELS),
        ]

    def collect(self) -> Iterator[Metric]:
        cpu, mem_pct, mem_used, mem_avail, disk_pct, disk_used, disk_avail = self._families()
        labels = ["Host", self.hostname]
        cpu.add_metric(labels, psutil.cpu_percent(interval=None))
        vm = psutil.virtual_memory()
        mem_pct.add_metric(labels, vm.percent)
        mem_used.add_metric(labels, vm.used / MB)
        mem_avail.add_metric(labels, vm.available / MB)
        yield from (cpu, mem_pct, mem_used, mem_avail)
        try:
            disk = psutil.disk_usage(self.disk_path)
        except OSError:  # the path vanished or is not readable: no disk series this scrape
            return
        disk_pct.add_metric(labels, disk.percent)
        disk_used.add_metric(labels, disk.used / GB)
        disk_avail.add_metric(labels, disk.free / GB)
        yield from (disk_pct, disk_used, disk_avail)


def load_nvml() -> ModuleType | None:
    """``pynvml`` initialised, or None when it is not installed or finds no driver."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError subclasses: no driver, no library, no permission
        log.info("NVML unavailable, no GPU metrics: %s", exc)
        return None
    return pynvml


class GpuCollector(Collector):
    """Per-device utilisation and memory through NVML; yields nothing without devices.

    ``nvml`` is an initialised ``pynvml``-compatible module (the I/O seam tests replace).
    """

    def __init__(self, hostname: str, nvml: Any) -> None:
        self.hostname = hostname
        self.nvml = nvml
        self._handles: list[tuple[str, Any]] = []
        try:
            count = nvml.nvmlDeviceGetCount()
            self._handles = [(str(i), nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
        except Exception as exc:  # NVMLError: report no GPUs rather than fail the server
            log.warning("NVML could not list devices, no GPU metrics: %s", exc)

    @property
    def device_count(self) -> int:
        return len(self._handles)

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def _families(self) -> list[GaugeMetricFamily]:
        return [
            _gauge("GPUUtilization", "GPU utilization (percent)", GPU_LABELS),
            _gauge("GPUMemoryUtilization", "GPU memory used over total (percent)", GPU_LABELS),
            _gauge("GPUMemoryUsed", "GPU memory used (megabytes)", GPU_LABELS),
        ]

    def collect(self) -> Iterator[Metric]:
        if not self._handles:
            return
        util_f, mem_pct_f, mem_used_f = self._families()
        nvml = self.nvml
        for device_id, handle in self._handles:
            try:
                util = nvml.nvmlDeviceGetUtilizationRates(handle)
                mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception:  # a device that fell off the bus: skip it this scrape
                log.debug("NVML read failed for GPU %s", device_id, exc_info=True)
                continue
            labels = ["Host", device_id, self.hostname]
            util_f.add_metric(labels, float(util.gpu))
            mem_pct_f.add_metric(labels, 100.0 * mem.used / mem.total if mem.total else 0.0)
            mem_used_f.add_metric(labels, mem.used / MB)
        yield from (util_f, mem_pct_f, mem_used_f)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # already shut down or never initialised
            self.nvml.nvmlShutdown()
