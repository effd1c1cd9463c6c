"""Memory detectors: memory_leak and memory_headroom.

A leak is told apart from the allocator and the warm-up by its shape:

- the first ``warmup_points`` are ignored (optimizer state and the caching
  allocator settle there);
- allocated memory (not reserved: the caching allocator keeps blocks on
  purpose) is summarised by the medians of eight segments of a window; a leak
  grows from segment to segment, while a one-off step (an eval, a longer
  batch, a new buffer) puts its growth into one or two;
- several windows watch at once, one point apart, 8 apart and 64 apart, so a
  fast leak is caught in tens of steps and a slow one over thousands, in
  constant memory.

With the device total known (from the config or the system samples) it
projects the steps and seconds left until OOM.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import pairwise
from typing import ClassVar, Literal

from steadytune.detect.base import Finding, KindInfo, Reporter, rounded
from steadytune.detect.points import RankStep
from steadytune.detect.stats import SortedWindow
from steadytune.records import Severity

KINDS: dict[str, KindInfo] = {
    "memory_leak": KindInfo(
        "memory grows steadily",
        "steady memory growth: tensors kept across steps (a loss kept with its graph, metrics "
        "accumulated without .item()/.detach(), a growing cache)",
        "log loss.item() instead of loss; detach what you keep; clear lists of tensors each step",
        "warning",
    ),
    "memory_headroom": KindInfo(
        "memory almost full",
        "memory in use is close to the total: the next longer batch or evaluation may OOM",
        "lower the micro-batch or sequence length, enable gradient checkpointing",
        "warning",
    ),
}

_STRIDES = (1, 8, 64)
_SEGMENTS = 8


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def leak_growth(
    points: list[tuple[int, float]], min_growth: float, min_bytes: float, steadiness: float
) -> float:
    """Bytes per step a window grows at when its growth looks like a leak, else 0.

    ``points`` are (step, bytes) in step order, cut into eight segments. The
    growth from the first segment's median to the last must be large
    (``min_growth`` of the level and ``min_bytes``); most segment-to-segment
    steps must rise (``steadiness``), and no single one may hold 40% of it:
    a one-off allocation rises in one or two steps, a leak in all of them.
    The rate is that of the second half, so a leak that started inside the
    window is not averaged down by the flat part before it.
    """
    q = len(points) // _SEGMENTS
    if q < 2:
        return 0.0

    def segment(i: int) -> float:
        return _median([v for _, v in points[i * q : (i + 1) * q]])

    # The first and last segments first: a window that did not grow (nearly every window, judged at
    # nearly every step) is let go without the medians between them.
    first, last = segment(0), segment(_SEGMENTS - 1)
    growth = last - first
    if growth <= max(min_growth * first, min_bytes):
        return 0.0
    meds = [first, *(segment(i) for i in range(1, _SEGMENTS - 1)), last]
    steps = [b - a for a, b in pairwise(meds)]
    rising = sum(1 for d in steps if d > 0.02 * growth)
    if rising < steadiness * len(steps) or max(steps) > 0.4 * growth:
        return 0.0
    half = _SEGMENTS // 2
    span = points[(_SEGMENTS - 1) * q + q // 2][0] - points[half * q + q // 2][0]
    return (meds[-1] - meds[half]) / span if span > 0 else 0.0


@dataclass(frozen=True, slots=True)
class LeakLimits:
    """As ``detect.memory`` names them (docs/detectors.md)."""

    warmup_points: int
    window: int
    leak_min_growth: float
    leak_min_bytes: int
    leak_steadiness: float


class LeakWatch:
    """memory_leak on one memory metric of one rank (allocated bytes, or host RSS).

    ``metric`` is the step record's field; ``total`` says which total bounds it: the
    device's memory, or the host's RAM. ``fallback``: the field judged instead by a run
    whose records never carry ``metric`` (OLMo logs only its peak allocated memory, per
    logging interval: a leak raises the peak of every interval as it raises what is
    allocated, while a one-off peak, a longer batch, is one step the rule passes over).
    """

    reports: ClassVar[tuple[str, ...]] = ("memory_leak",)

    def __init__(
        self,
        limits: LeakLimits,
        metric: str,
        total: Literal["device", "ram"],
        rank: int | None = None,
        fallback: str | None = None,
    ) -> None:
        self.metric = metric
        self._fallback = fallback
        self.rep = Reporter(rank)
        self.lim = limits
        self._device = total == "device"
        self._n = 0
        self._windows: dict[int, deque[tuple[int, float]]] = {
            s: deque(maxlen=limits.window) for s in _STRIDES
        }
        self._half = limits.window // 2
        self._step_times = SortedWindow(32)

    def observe(self, point: RankStep, out: list[Finding]) -> None:
        rec = point.rec
        value = getattr(rec, self.metric)
        if value is None and self._fallback is not None and self._n == 0:
            value = getattr(rec, self._fallback)
            if value is not None:  # the run logs the fallback alone: judged, and named, on it
                self.metric, self._fallback = self._fallback, None
        if value is not None:
            total = point.device_total if self._device else point.ram_total
            self.judge(rec.step, float(value), total, rec.step_time_s, out)

    def judge(
        self, step: int, value: float, total: float | None, step_time: float | None, out: list[Finding]
    ) -> None:
        self._n += 1
        if step_time is not None and step_time > 0:
            self._step_times.push(step_time)
        if self._n <= self.lim.warmup_points:
            return
        k = self._n - self.lim.warmup_points
        rate, stride = 0.0, 0
        for s, win in self._windows.items():
            if k % s:
                continue
            win.append((step, value))
            # A window is re-judged only when it gets a point; slower windows cost nothing in between.
            # The one-point window every fourth point (counted in points, not in the window's length,
            # which stops moving once the window is full): a leak grows over hundreds of steps.
            if len(win) >= self._half and (s > 1 or k % 4 == 0):
                r = leak_growth(
                    list(win), self.lim.leak_min_growth, self.lim.leak_min_bytes, self.lim.leak_steadiness
                )
                if r > rate:
                    rate, stride = r, s
        if rate > 0:
            self._raise(step, value, total, rate, stride, out)
        elif k % 4 == 0 and self.rep.is_on("memory_leak", self.metric) and not self._any_growth():
            self.rep.report(out, "memory_leak", self.metric, step, False)

    def _any_growth(self) -> bool:
        for win in self._windows.values():
            if len(win) >= self._half:
                pts = list(win)
                if leak_growth(pts, self.lim.leak_min_growth / 2, self.lim.leak_min_bytes / 2, 0.0) > 0:
                    return True
        return False

    def _raise(
        self, step: int, value: float, total: float | None, rate: float, stride: int, out: list[Finding]
    ) -> None:
        ev = None
        if not self.rep.is_on("memory_leak", self.metric):
            ev = {"value_bytes": int(value), "growth_bytes_per_step": rounded(rate), "window_stride": stride}
            if total:
                left = max(0.0, total - value)
                steps_left = left / rate
                ev["total_bytes"] = int(total)
                ev["headroom_free_ratio"] = rounded(left / total, 4)
                ev["projected_steps_to_oom"] = int(steps_left)
                if len(self._step_times):
                    ev["projected_seconds_to_oom"] = rounded(steps_left * self._step_times.median(), 4)
        self.rep.report(out, "memory_leak", self.metric, step, True, evidence=ev)


@dataclass(frozen=True, slots=True)
class HeadroomLimits:
    """Used/total shares that warn and that are critical, as ``detect.memory`` names them."""

    headroom_warning: float
    headroom_critical: float


class HeadroomWatch:
    """memory_headroom: used / total above the warning or critical share.

    Fed a rank's steps, it judges what the allocator holds (reserved, or the peak)
    against the device's total; the system watch also uses :meth:`judge` for GPU and RAM.
    """

    reports: ClassVar[tuple[str, ...]] = ("memory_headroom",)

    def __init__(self, limits: HeadroomLimits, metric: str, rank: int | None = None) -> None:
        self.metric = metric
        self.rep = Reporter(rank)
        self.lim = limits

    def observe(self, point: RankStep, out: list[Finding]) -> None:
        rec, total = point.rec, point.device_total
        held = max(rec.mem_reserved_bytes or 0, rec.mem_peak_bytes or 0)
        if held and total:
            self.judge(rec.step, float(held), float(total), out)

    def judge(self, step: int, used: float, total: float | None, out: list[Finding]) -> None:
        if not total or total <= 0:
            return
        share = used / total
        if share >= self.lim.headroom_warning:
            ev = None
            if not self.rep.is_on("memory_headroom", self.metric):
                ev = {
                    "used_bytes": int(used),
                    "total_bytes": int(total),
                    "used_ratio": rounded(share, 4),
                    "threshold_ratio": self.lim.headroom_warning,
                }
            sev: Severity = "critical" if share >= self.lim.headroom_critical else "warning"
            self.rep.report(out, "memory_headroom", self.metric, step, True, severity=sev, evidence=ev)
        elif share < self.lim.headroom_warning - 0.02:
            self.rep.report(out, "memory_headroom", self.metric, step, False)
