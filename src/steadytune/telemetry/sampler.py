"""System sampler: CPU, RAM, disk and the worker's memory (psutil), GPUs (NVML when present).

A reading that is unavailable is ``None``, never an exception: no NVML library,
no GPU, a process that just exited — the sample still comes back.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

from steadytune.records import GpuSample, SystemSample


def nvml_read(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or None when it raises: one unsupported reading (power on some boards) is N/A."""
    try:
        return fn(*args)
    except Exception:
        return None


class Nvml:
    """A thin, failure-tolerant view of NVML (package ``nvidia-ml-py``)."""

    def __init__(self) -> None:
        self._nv: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nv = pynvml
        except Exception:
            self._nv = None

    @property
    def available(self) -> bool:
        return self._nv is not None

    _read = staticmethod(nvml_read)

    def sample(self) -> tuple[GpuSample, ...]:
        nv = self._nv
        if nv is None:
            return ()
        count = self._read(nv.nvmlDeviceGetCount) or 0
        out = []
        for i in range(count):
            h = self._read(nv.nvmlDeviceGetHandleByIndex, i)
            if h is None:
                continue
            mem = self._read(nv.nvmlDeviceGetMemoryInfo, h)
            util = self._read(nv.nvmlDeviceGetUtilizationRates, h)
            name = self._read(nv.nvmlDeviceGetName, h)
            power = self._read(nv.nvmlDeviceGetPowerUsage, h)
            ecc = self._read(
                nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
            )
            temp = self._read(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
            out.append(
                GpuSample(
                    index=i,
                    name=name.decode() if isinstance(name, bytes) else (name or ""),
                    util_ratio=util.gpu / 100.0 if util is not None else None,
                    mem_used_bytes=int(mem.used) if mem is not None else None,
                    mem_total_bytes=int(mem.total) if mem is not None else None,
                    temperature_c=float(temp) if temp is not None else None,
                    power_w=power / 1000.0 if power is not None else None,
                    ecc_errors=int(ecc) if ecc is not None else None,
                )
            )
        return tuple(out)


class SystemSampler:
    """Takes :class:`SystemSample` readings for a run directory and a worker process tree."""

    def __init__(
        self, disk_path: Path, clock: Callable[[], float] = time.time, nvml: Nvml | None = None
    ) -> None:
        self.disk_path = disk_path
        self.clock = clock
        self.nvml = nvml if nvml is not None else Nvml()
        psutil.cpu_percent(None)  # the first call primes the counter and returns 0

    def tree_rss(self, pid: int | None, tree: Sequence[int] | None = None) -> int | None:
        """Resident memory of ``pid`` and its descendants (None when none of them is there).

        ``tree``: those pids, when the caller has just read them: finding them reads every
        process of the machine, which the supervisor does once per sample, not twice.
        """
        if not pid:
            return None
        if tree is None:
            try:
                tree = [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
            except psutil.Error:
                return None
        total, seen = 0, False
        for p in tree:
            try:
                total += psutil.Process(p).memory_info().rss
                seen = True
            except psutil.Error:
                continue
        return total if seen else None

    def sample(self, worker_pid: int | None = None, tree: Sequence[int] | None = None) -> SystemSample:
        vm = psutil.virtual_memory()
        free: int | None
        total: int | None
        try:
            du = shutil.disk_usage(self.disk_path)
            free, total = du.free, du.total
        except OSError:
            free = total = None
        return SystemSample(
            ts=self.clock(),
            cpu_ratio=psutil.cpu_percent(None) / 100.0,
            ram_used_bytes=int(vm.total - vm.available),
            ram_total_bytes=int(vm.total),
            disk_free_bytes=free,
            disk_total_bytes=total,
            worker_rss_bytes=self.tree_rss(worker_pid, tree),
            gpus=self.nvml.sample(),
        )
