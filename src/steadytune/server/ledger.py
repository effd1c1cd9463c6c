"""The GPU ledger: what each device holds, what is promised to admitted jobs, what is left.

Pure: readings (from NVML, or a snapshot file) and the reservations of admitted jobs go
in, one :class:`GpuState` per device comes out. No clock, no I/O.

A job's reservation is its estimated peak per device. Once the job runs, NVML's "used"
already counts what it has allocated, so only the part of the reservation it has not
yet touched is *outstanding*; counting the whole reservation on top of "used" would
charge a running job twice. When NVML cannot say how much a process holds (some
containers report N/A), the whole reservation stays outstanding: a job may then wait
longer than it must, but a neighbour is never starved of memory it was promised.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

GIB = 1 << 30


@dataclass(frozen=True)
class GpuProcess:
    """One compute process on a device; ``used_bytes`` is None when NVML cannot tell."""

    pid: int
    used_bytes: int | None = None


@dataclass(frozen=True)
class GpuReading:
    """One device as NVML sees it now."""

    index: int
    total_bytes: int
    used_bytes: int
    name: str = ""
    util_ratio: float | None = None
    processes: tuple[GpuProcess, ...] = ()

    @property
    def free_bytes(self) -> int:
        return max(0, self.total_bytes - self.used_bytes)


@dataclass(frozen=True)
class Reservation:
    """Memory promised to an admitted or running job on one device."""

    job_id: str
    gpu: int
    bytes: int


@dataclass(frozen=True)
class GpuState:
    """A device in the ledger: readings, outstanding reservations and who is on it."""

    index: int
    name: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    reserved_bytes: int  # outstanding: promised to jobs and not yet allocated by them
    util_ratio: float | None
    jobs: tuple[str, ...]
    foreign: tuple[GpuProcess, ...]  # processes steadytune did not start
    job_used: Mapping[str, int | None] = field(default_factory=dict)

    def available(self, headroom_bytes: int) -> int:
        """What a new job may take here: free − reserved − headroom (never below 0)."""
        return max(0, self.free_bytes - self.reserved_bytes - headroom_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "total_bytes": self.total_bytes,
            "used_bytes": self.used_bytes,
            "free_bytes": self.free_bytes,
            "reserved_bytes": self.reserved_bytes,
            "util_ratio": self.util_ratio,
            "jobs": list(self.jobs),
            "foreign": [{"pid": p.pid, "used_bytes": p.used_bytes} for p in self.foreign],
            "job_used": dict(self.job_used),
        }


def _job_use(reading: GpuReading, pids: Iterable[int]) -> int | None:
    """Bytes the job's processes hold on this device; None when any of them is unknown."""
    mine = set(pids)
    total = 0
    for proc in reading.processes:
        if proc.pid in mine:
            if proc.used_bytes is None:
                return None
            total += proc.used_bytes
    return total


def build_ledger(
    readings: Iterable[GpuReading],
    reservations: Iterable[Reservation],
    job_pids: Mapping[str, Iterable[int]] | None = None,
) -> tuple[GpuState, ...]:
    """One :class:`GpuState` per reading, in device order.

    Args:
        readings: the devices now.
        reservations: what admitted and running jobs were promised, per device.
        job_pids: each job's process tree (pids); processes on a device in no job's
            tree are foreign and count as used (NVML already includes them in "used").
    """
    job_pids = {k: set(v) for k, v in (job_pids or {}).items()}
    ours = set().union(*job_pids.values()) if job_pids else set()
    by_gpu: dict[int, list[Reservation]] = {}
    for r in reservations:
        by_gpu.setdefault(r.gpu, []).append(r)
    out = []
    for reading in sorted(readings, key=lambda g: g.index):
        outstanding = 0
        used_by: dict[str, int | None] = {}
        for r in by_gpu.get(reading.index, []):
            use = _job_use(reading, job_pids.get(r.job_id, ()))
            used_by[r.job_id] = use
            outstanding += r.bytes if use is None else max(0, r.bytes - use)
        out.append(
            GpuState(
                index=reading.index,
                name=reading.name,
                total_bytes=reading.total_bytes,
                used_bytes=reading.used_bytes,
                free_bytes=reading.free_bytes,
                reserved_bytes=outstanding,
                util_ratio=reading.util_ratio,
                jobs=tuple(r.job_id for r in by_gpu.get(reading.index, [])),
                foreign=tuple(p for p in reading.processes if p.pid not in ours),
                job_used=used_by,
            )
        )
    return tuple(out)


def readings_from_dict(data: Any) -> tuple[GpuReading, ...]:
    """Readings from a snapshot dict, ``{"gpus": [{"index", "total_bytes", "used_bytes", ...}]}``.

    The same shape serves recorded snapshots (benchmarks), test fixtures and
    ``steadytune server --snapshot-file``.

    Raises:
        ValueError: naming the device and key that is missing or wrong.
    """
    gpus = data.get("gpus") if isinstance(data, dict) else None
    if not isinstance(gpus, list):
        raise ValueError('a GPU snapshot is {"gpus": [{"index": 0, "total_bytes": N, "used_bytes": N}, ...]}')
    out = []
    for n, g in enumerate(gpus):
        if not isinstance(g, dict):
            raise ValueError(f"gpus[{n}]: {g!r} is not an object")
        problems = [
            f"gpus[{n}].{k}={g.get(k)!r}: give a whole number ≥ 0"
            for k in ("index", "total_bytes", "used_bytes")
            if not isinstance(g.get(k), int) or isinstance(g.get(k), bool) or g[k] < 0
        ]
        if problems:
            raise ValueError("; ".join(problems))
        procs = []
        for p in g.get("processes") or []:
            if not isinstance(p, dict) or not isinstance(p.get("pid"), int):
                raise ValueError(f"gpus[{n}].processes: {p!r} needs an integer pid")
            used = p.get("used_bytes")
            procs.append(GpuProcess(pid=p["pid"], used_bytes=int(used) if used is not None else None))
        util = g.get("util_ratio")
        out.append(
            GpuReading(
                index=g["index"],
                total_bytes=g["total_bytes"],
                used_bytes=g["used_bytes"],
                name=str(g.get("name", "")),
                util_ratio=float(util) if util is not None else None,
                processes=tuple(procs),
            )
        )
    return tuple(out)
