"""``mem-profile``: sample a process tree's memory and tell a leak from noise.

Samples RSS and USS of the process and all its children (psutil) and, through
NVML when there is a GPU, each process's GPU memory. The growth rate is the
Theil–Sen slope (the median of all pairwise slopes), which a garbage-collector
sawtooth or a one-off allocation barely moves, and the projection to OOM
divides the headroom (available RAM, GPU total) by it.

The sampler, clock and sleep are injected so tests can be exact.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_PAIRS_POINTS = 400  # Theil–Sen is O(n^2): thin longer series evenly
MIN_GROWTH_BYTES = 16 * 1024**2
MIN_GROWTH_SHARE = 0.05
MIN_AGREEMENT = 0.7  # share of pairwise slopes that must be positive to call a rise a trend


@dataclass(frozen=True)
class MemSample:
    ts: float
    rss: int
    uss: int | None = None
    gpu: int | None = None
    procs: int = 1


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """``(slope, share of pairwise slopes > 0)``; (0, 0) with fewer than two distinct x."""
    n = len(xs)
    if n > MAX_PAIRS_POINTS:
        idx = [round(i * (n - 1) / (MAX_PAIRS_POINTS - 1)) for i in range(MAX_PAIRS_POINTS)]
        xs, ys = [xs[i] for i in idx], [ys[i] for i in idx]
        n = len(xs)
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(n) for j in range(i + 1, n) if xs[j] != xs[i]]
    if not slopes:
        return 0.0, 0.0
    slopes.sort()
    m = len(slopes)
    median = slopes[m // 2] if m % 2 else (slopes[m // 2 - 1] + slopes[m // 2]) / 2
    return median, sum(1 for s in slopes if s > 0) / m


@dataclass
class SeriesReport:
    name: str
    first: int
    last: int
    peak: int
    slope_bps: float  # bytes per second
    agreement: float
    limit: int | None = None  # what it runs out against
    eta_s: float | None = None  # seconds to the limit at this slope
    growing: bool = False


@dataclass
class MemReport:
    pid: int
    samples: int
    duration_s: float
    series: list[SeriesReport] = field(default_factory=list)
    allocator: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def leak_suspected(self) -> bool:
        return any(s.growing for s in self.series)


def judge(name: str, ts: Sequence[float], values: Sequence[int], limit: int | None) -> SeriesReport:
    """Slope, trend agreement, projection; ``growing`` when the rise is both steady and sizeable."""
    slope, agree = theil_sen(ts, values)
    duration = ts[-1] - ts[0] if len(ts) > 1 else 0.0
    rise = slope * duration
    typical = sorted(values)[len(values) // 2] if values else 0
    growing = (
        slope > 0 and agree >= MIN_AGREEMENT and rise >= max(MIN_GROWTH_BYTES, MIN_GROWTH_SHARE * typical)
    )
    eta = None
    if slope > 0 and limit is not None:
        eta = max(0.0, (limit - values[-1]) / slope)
    return SeriesReport(
        name, int(values[0]), int(values[-1]), int(max(values)), slope, agree, limit, eta, growing
    )


def analyze(
    pid: int, samples: Sequence[MemSample], ram_available: int | None, gpu_total: int | None
) -> MemReport:
    """Judge each series: RSS and USS against the RAM still available, GPU against its total."""
    rep = MemReport(pid, len(samples), samples[-1].ts - samples[0].ts if samples else 0.0)
    if len(samples) < 3:
        rep.notes.append("fewer than 3 samples: sample longer (--seconds) or more often (--interval)")
        return rep
    ts = [s.ts for s in samples]
    # Headroom counts from where the series started: available RAM already excludes what it holds now.
    ram_limit = samples[-1].rss + ram_available if ram_available is not None else None
    rep.series.append(judge("rss", ts, [s.rss for s in samples], ram_limit))
    if all(s.uss is not None for s in samples):
        uss_limit = samples[-1].uss + ram_available if ram_available is not None else None  # type: ignore[operator]
        rep.series.append(judge("uss", ts, [int(s.uss or 0) for s in samples], uss_limit))
    else:
        rep.notes.append("USS: N/A (needs permission to read the process's memory maps)")
    if all(s.gpu is not None for s in samples):
        rep.series.append(judge("gpu", ts, [int(s.gpu or 0) for s in samples], gpu_total))
    else:
        rep.notes.append("GPU memory: N/A (no NVML, no GPU, or the process holds no GPU memory)")
    return rep


class TreeSampler:
    """Memory of a process and its descendants, now. GPU through NVML, loaded lazily."""

    def __init__(self, pid: int, process: Callable[[int], Any] | None = None, nvml: Any = "auto") -> None:
        import psutil

        self.pid = pid
        self._process = process or psutil.Process
        self._nvml = nvml
        self.gpu_total: int | None = None

    def _tree(self) -> list[Any]:
        root = self._process(self.pid)
        try:
            return [root, *root.children(recursive=True)]
        except Exception:
            return [root]

    def _gpu(self, pids: set[int]) -> int | None:
        nv = self._nvml
        if nv == "auto":
            try:
                import pynvml

                pynvml.nvmlInit()
                nv = self._nvml = pynvml
            except Exception:
                nv = self._nvml = None
        if nv is None:
            return None
        used, total, seen = 0, 0, False
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                procs = list(nv.nvmlDeviceGetComputeRunningProcesses(h))
                mine = [p for p in procs if p.pid in pids]
                if mine:
                    seen = True
                    used += sum(int(p.usedGpuMemory or 0) for p in mine)
                    total += int(nv.nvmlDeviceGetMemoryInfo(h).total)
        except Exception:
            return None
        if seen:
            self.gpu_total = total
        return used if seen else None

    def sample(self, now: float) -> MemSample:
        rss, uss, uss_ok, pids = 0, 0, True, set()
        for p in self._tree():
            try:
                rss += int(p.memory_info().rss)
                pids.add(int(p.pid))
            except Exception:
                continue  # a child that just exited
            try:
                uss += int(p.memory_full_info().uss)
            except Exception:
                uss_ok = False
        return MemSample(now, rss, uss if uss_ok else None, self._gpu(pids), len(pids))


def profile(
    sampler: Any,
    seconds: float,
    interval: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_sample: Callable[[MemSample], None] | None = None,
    alive: Callable[[], bool] = lambda: True,
) -> list[MemSample]:
    """Sample every ``interval`` seconds for ``seconds`` (or until ``alive()`` turns false)."""
    samples: list[MemSample] = []
    start = clock()
    while True:
        now = clock()
        try:
            s = sampler.sample(now - start)
        except Exception:  # the process is gone
            break
        samples.append(s)
        if on_sample:
            on_sample(s)
        if now - start >= seconds or not alive():
            break
        sleep(max(0.0, interval - (clock() - now)))
    return samples


def allocator_report(steps: Sequence[Any]) -> dict[str, Any] | None:
    """Torch allocator figures of a steadytune worker from its step records (``mem_*`` fields)."""
    rows = [s for s in steps if s.mem_allocated_bytes is not None]
    if len(rows) < 2:
        return None
    xs = [float(s.step) for s in rows]
    out: dict[str, Any] = {"steps": f"{rows[0].step}-{rows[-1].step}"}
    for key in ("mem_allocated_bytes", "mem_reserved_bytes", "mem_peak_bytes"):
        ys = [getattr(s, key) for s in rows]
        if all(y is not None for y in ys):
            slope, agree = theil_sen(xs, ys)
            out[key] = {
                "last": ys[-1],
                "max": max(ys),
                "slope_bytes_per_step": slope,
                "agreement": round(agree, 3),
            }
    return out
