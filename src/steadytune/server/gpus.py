"""Where the ledger's GPU readings come from: NVML, or a snapshot file.

A source is any callable returning ``tuple[GpuReading, ...]``. NVML (package
``nvidia-ml-py``) is read the way the run sampler reads it (telemetry/sampler.py):
a reading that fails is left out, never an exception. A snapshot file
(``steadytune server --snapshot-file``) holds the same readings as JSON, read again
at every call: for machines without a GPU (dry runs, tests, benchmarks) and for
replaying a recorded situation.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from steadytune.server.ledger import GpuProcess, GpuReading, readings_from_dict
from steadytune.telemetry.sampler import Nvml

GpuSource = Callable[[], tuple[GpuReading, ...]]


class NvmlSource(Nvml):
    """Readings of every device NVML sees, with its compute processes (the sampler's NVML view)."""

    def _processes(self, handle: Any) -> tuple[GpuProcess, ...]:
        nv = self._nv
        procs = self._read(nv.nvmlDeviceGetComputeRunningProcesses, handle) or []
        out = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            # NVML reports "not available" as None or as a huge sentinel, depending on the driver.
            ok = isinstance(used, int) and 0 <= used < (1 << 60)
            out.append(GpuProcess(pid=int(p.pid), used_bytes=int(used) if ok and used is not None else None))
        return tuple(out)

    def __call__(self) -> tuple[GpuReading, ...]:
        nv = self._nv
        if nv is None:
            return ()
        out = []
        for i in range(self._read(nv.nvmlDeviceGetCount) or 0):
            h = self._read(nv.nvmlDeviceGetHandleByIndex, i)
            mem = self._read(nv.nvmlDeviceGetMemoryInfo, h) if h is not None else None
            if mem is None:
                continue  # without memory figures a device cannot be admitted to
            util = self._read(nv.nvmlDeviceGetUtilizationRates, h)
            name = self._read(nv.nvmlDeviceGetName, h)
            out.append(
                GpuReading(
                    index=i,
                    total_bytes=int(mem.total),
                    used_bytes=int(mem.used),
                    name=name.decode() if isinstance(name, bytes) else (name or ""),
                    util_ratio=util.gpu / 100.0 if util is not None else None,
                    processes=self._processes(h),
                )
            )
        return tuple(out)


class SnapshotFileSource:
    """Readings from a JSON file (``{"gpus": [...]}``, see ledger.readings_from_dict), read at each call.

    A file that is missing or half-written gives the last good readings, so a test or
    an operator may rewrite it while the daemon runs.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._last: tuple[GpuReading, ...] = ()
        self.load()  # a file that is wrong from the start is the user's mistake: say so now

    def load(self) -> tuple[GpuReading, ...]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ValueError(f"--snapshot-file {self.path}: no such file") from exc
        except ValueError as exc:
            raise ValueError(f"--snapshot-file {self.path}: not JSON ({exc})") from exc
        self._last = readings_from_dict(data)
        return self._last

    def __call__(self) -> tuple[GpuReading, ...]:
        try:
            return self.load()
        except ValueError:
            return self._last


def only(source: GpuSource, indices: set[int] | None) -> GpuSource:
    """A source limited to the devices ``steadytune server --gpus`` manages."""
    if not indices:
        return source
    return lambda: tuple(g for g in source() if g.index in indices)
