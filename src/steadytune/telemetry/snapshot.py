"""System readings from a file: the rules of a run tried on a machine without the GPUs they watch.

With ``$STEADYTUNE_SYSTEM_SNAPSHOT`` naming a JSON file, the supervisor's sampler takes
the CPU and GPU readings from it, read again at every sample, and the rest (RAM, disk,
the worker's memory) from the machine. It is for tests and drills: the autoscaling
rules (``scale:``) see "GPU util 95% for 3 s" on a CPU-only box. The file holds the
fields of :class:`~steadytune.records.SystemSample` and
:class:`~steadytune.records.GpuSample`, ratios in 0..1::

    {"cpu_ratio": 0.4, "gpus": [{"index": 0, "util_ratio": 0.95}, {"index": 1, "util_ratio": 0.0}]}

A file that is missing, half written or not that shape reads as "no reading" (None),
never as an exception: a writer may replace it at any moment.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from steadytune.records import GpuSample, SystemSample
from steadytune.regularfile import read_text
from steadytune.telemetry.sampler import Nvml, SystemSampler

ENV = "STEADYTUNE_SYSTEM_SNAPSHOT"
_GPU_FIELDS = {f.name for f in dataclasses.fields(GpuSample)}


def _gpus(raw: Any) -> tuple[GpuSample, ...] | None:
    if not isinstance(raw, list):
        return None
    out = []
    for g in raw:
        if not isinstance(g, dict) or not isinstance(g.get("index"), int):
            return None
        out.append(GpuSample(**{k: v for k, v in g.items() if k in _GPU_FIELDS}))
    return tuple(out)


def read_snapshot(path: Path) -> tuple[float | None, tuple[GpuSample, ...]]:
    """The CPU ratio and the GPUs the file says; (None, ()) when it cannot be read."""
    try:
        data = json.loads(read_text(path))
    except (OSError, ValueError):
        return None, ()
    if not isinstance(data, dict):
        return None, ()
    cpu = data.get("cpu_ratio")
    gpus = _gpus(data.get("gpus", []))
    return (float(cpu) if isinstance(cpu, (int, float)) else None), (gpus or ())


class SnapshotSampler(SystemSampler):
    """The machine's readings, with the CPU and GPUs replaced by those of ``path``."""

    def __init__(self, disk_path: Path, path: Path, clock: Callable[[], float] = time.time) -> None:
        super().__init__(disk_path, clock=clock, nvml=_NoGpus())
        self.path = path

    def sample(self, worker_pid: int | None = None, tree: Sequence[int] | None = None) -> SystemSample:
        real = super().sample(worker_pid, tree)
        cpu, gpus = read_snapshot(self.path)
        return dataclasses.replace(real, cpu_ratio=cpu, gpus=gpus)


class _NoGpus(Nvml):
    """The real GPUs are not read: the file stands for them (an NVML view that found none)."""

    def __init__(self) -> None:
        self._nv = None


def sampler_from_env(
    disk_path: Path, clock: Callable[[], float] = time.time, environ: Mapping[str, str] | None = None
) -> SystemSampler:
    """The file's sampler when ``$STEADYTUNE_SYSTEM_SNAPSHOT`` is set, else the machine's."""
    path = (environ if environ is not None else os.environ).get(ENV)
    if path:
        return SnapshotSampler(disk_path, Path(path), clock=clock)
    return SystemSampler(disk_path, clock=clock)
