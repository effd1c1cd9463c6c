"""System detectors, fed :class:`SystemSample`: gpu_thermal, gpu_error, disk_low, host/GPU headroom.

A reading that is unavailable is ``None`` and simply not judged. Samples carry
no step, so an anomaly is placed at the last training step the caller saw.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import ClassVar

from steadytune.detect.base import Finding, KindInfo, Reporter, rounded
from steadytune.detect.memory import HeadroomLimits, HeadroomWatch
from steadytune.detect.points import SystemPoint
from steadytune.records import GpuSample, Severity, SystemSample

_ERROR_QUIET_SAMPLES = 30  # an error episode ends after this many samples without a new error

KINDS: dict[str, KindInfo] = {
    "gpu_thermal": KindInfo(
        "GPU too hot",
        "the GPU runs at a temperature where it throttles its clocks",
        "check cooling and fans, lower the power limit, space out the GPUs",
        "warning",
    ),
    "gpu_error": KindInfo(
        "GPU errors",
        "the GPU reported ECC or Xid errors: failing memory or a driver fault",
        "drain the GPU, check `nvidia-smi -q -d ECC` and the kernel log; restart on healthy GPUs",
        "critical",
    ),
    "disk_low": KindInfo(
        "disk almost full",
        "the disk of the run directory is filling; the next checkpoint may be torn",
        "free space, lower save_total_limit, or move the run directory",
        "warning",
    ),
}


@dataclass(frozen=True, slots=True)
class SystemLimits:
    """As ``detect.system`` names them; ``headroom_*`` (GPU memory) as ``detect.memory``."""

    gpu_temp_warning_c: float
    gpu_temp_critical_c: float
    gpu_temp_points: int
    disk_free_warning: float
    disk_free_critical: float
    disk_min_free_bytes: int
    ram_warning: float
    ram_critical: float
    headroom_warning: float
    headroom_critical: float


class SystemWatch:
    """Every system-sample detector."""

    reports: ClassVar[tuple[str, ...]] = ("gpu_thermal", "gpu_error", "disk_low", "memory_headroom")

    def __init__(self, limits: SystemLimits) -> None:
        self.rep = Reporter(None)
        self.lim = limits
        self._gpu_headroom = HeadroomLimits(limits.headroom_warning, limits.headroom_critical)
        self._hot: dict[int, int] = {}
        self._errors: dict[tuple[int, str], int] = {}
        self._quiet: dict[tuple[int, str], int] = {}
        self._disk: deque[tuple[float, float]] = deque(maxlen=32)
        self._ram = HeadroomWatch(HeadroomLimits(limits.ram_warning, limits.ram_critical), "ram_used_bytes")
        self._gpu_mem: dict[int, HeadroomWatch] = {}
        self.gpu_totals: dict[int, int] = {}
        # Disk the run will still write (checkpoints to come, caches): see set_projected_need.
        self.projected_need_bytes: int | None = None

    def set_projected_need(self, need_bytes: int | None) -> None:
        """Tell disk_low how much the run will still write (steadytune.preflight.disk.run_disk_need);
        free space below it is low even when the share of the disk looks fine."""
        self.projected_need_bytes = need_bytes

    def observe(self, point: SystemPoint, out: list[Finding]) -> None:
        s, step = point.sample, point.step
        for g in s.gpus:
            self._thermal(g, step, out)
            self._gpu_errors(g, step, out)
            if g.mem_total_bytes:
                self.gpu_totals[g.index] = g.mem_total_bytes
            if g.mem_used_bytes is not None and g.mem_total_bytes:
                watch = self._gpu_mem.get(g.index)
                if watch is None:
                    watch = self._gpu_mem[g.index] = HeadroomWatch(
                        self._gpu_headroom, f"gpu{g.index}_mem_used_bytes"
                    )
                watch.judge(step, g.mem_used_bytes, g.mem_total_bytes, out)
        if s.ram_used_bytes is not None and s.ram_total_bytes:
            self._ram.judge(step, s.ram_used_bytes, s.ram_total_bytes, out)
        if s.disk_free_bytes is not None and s.disk_total_bytes:
            self._disk_low(s, step, out)

    def _thermal(self, g: GpuSample, step: int, out: list[Finding]) -> None:
        if g.temperature_c is None:
            return
        metric = f"gpu{g.index}_temperature_c"
        hot = g.temperature_c >= self.lim.gpu_temp_warning_c
        self._hot[g.index] = self._hot.get(g.index, 0) + 1 if hot else 0
        critical = g.temperature_c >= self.lim.gpu_temp_critical_c
        # The samples in a row guard the warning level, which a burst of boost clocks can touch;
        # at the critical level the GPU is already throttling, and a temperature does not jump
        # there by sensor noise (it has the card's thermal mass behind it): one sample is enough.
        if self._hot[g.index] >= self.lim.gpu_temp_points or critical:
            sev: Severity = "critical" if critical else "warning"
            ev = None
            if not self.rep.is_on("gpu_thermal", metric):
                ev = {
                    "temperature_c": g.temperature_c,
                    "threshold_c": self.lim.gpu_temp_warning_c,
                    "gpu": g.index,
                }
            self.rep.report(out, "gpu_thermal", metric, step, True, severity=sev, evidence=ev)
        elif g.temperature_c < self.lim.gpu_temp_warning_c - 3.0:
            self.rep.report(out, "gpu_thermal", metric, step, False)

    def _gpu_errors(self, g: GpuSample, step: int, out: list[Finding]) -> None:
        for name, count in (("ecc_errors", g.ecc_errors), ("xid_errors", g.xid_errors)):
            if count is None:
                continue
            key, metric = (g.index, name), f"gpu{g.index}_{name}"
            seen = self._errors.get(key)
            self._errors[key] = count
            if seen is not None and count > seen:
                self._quiet[key] = 0
                ev = {"errors": count, "new_errors": count - seen, "gpu": g.index}
                self.rep.report(out, "gpu_error", metric, step, True, evidence=ev)
            elif self.rep.is_on("gpu_error", metric):
                self._quiet[key] = self._quiet.get(key, 0) + 1
                if self._quiet[key] >= _ERROR_QUIET_SAMPLES:
                    self.rep.report(out, "gpu_error", metric, step, False)

    def _disk_low(self, s: SystemSample, step: int, out: list[Finding]) -> None:
        free, total = float(s.disk_free_bytes or 0), float(s.disk_total_bytes or 1)
        self._disk.append((s.ts, free))
        share = free / total
        absolute = total > 2 * self.lim.disk_min_free_bytes and free < self.lim.disk_min_free_bytes
        need = self.projected_need_bytes
        absolute = absolute or (need is not None and free < need)  # the coming checkpoints will not fit
        low = share < self.lim.disk_free_warning or absolute
        if low:
            ev = None
            if not self.rep.is_on("disk_low", "disk_free_bytes"):
                ev = {
                    "free_bytes": int(free),
                    "total_bytes": int(total),
                    "free_ratio": rounded(share, 4),
                    "threshold_ratio": self.lim.disk_free_warning,
                }
                if need is not None:
                    ev["projected_need_bytes"] = int(need)
                t0, f0 = self._disk[0]
                if s.ts > t0 and f0 > free:
                    ev["projected_seconds_to_full"] = rounded(free / ((f0 - free) / (s.ts - t0)), 4)
            sev: Severity = "critical" if share < self.lim.disk_free_critical else "warning"
            self.rep.report(out, "disk_low", "disk_free_bytes", step, True, severity=sev, evidence=ev)
        elif share > self.lim.disk_free_warning * 1.2 and not absolute:
            self.rep.report(out, "disk_low", "disk_free_bytes", step, False)
