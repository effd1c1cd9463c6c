"""Baseline detectors from their published rules, and the scoring the detection benchmark uses.

Each baseline sees the same record stream as steadytune and returns alarms:
(kind or None, severity, start_step). Consecutive flagged points are one alarm
(raised once), as for steadytune. Baselines do not name a kind, so any of their
alarms in the right place counts as a catch: that favours them.

- llm-foundry ``KillLossSpike`` (callbacks/kill_loss_spike_callback.py): a
  window of the last 100 losses, full before it judges; a loss >= 2x the window
  mean is an outlier; more than ``patience`` = 4 outliers in a row is a spike;
  after 2 windows, half of the window above ``loss_cap`` = 10 is "high loss".
  Every loss enters the window (so a NaN poisons the mean and nothing fires).
- OLMo-core ``SkipStepOptimizer``: the last 128 losses and grad norms, at least
  64 before it judges; a step whose loss or grad norm is more than 6 standard
  deviations above the window mean is skipped (a NaN compares false: skipped).
- Megatron-LM: a NaN/Inf loss or grad norm is fatal; the rerun state machine
  flags a loss above 10x the largest of the first 100 losses.
- W&B Automations ``MetricZScoreFilter`` at its defaults (window 30, threshold 3.0), one
  filter on the loss and one on the grad norm, watching increases: a value more than 3
  standard deviations above the mean of the previous 30 values (the window full first).
- naive thresholds, what a user writes in a callback: NaN/Inf, loss > 2x the
  previous one, loss == 0, grad norm > 10, GPU above 85 C, memory above 95%,
  disk below 5% free, no step for 10 minutes.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from typing import Any

from steadytune.records import StepRecord, SystemSample

Alarm = tuple[str | None, str, int]


class Rolling:
    """Mean and sample standard deviation of the last ``size`` values, in O(1) per value.

    As with numpy/torch on the real window, a NaN or Inf in the window makes the
    mean NaN while it is there (comparisons with NaN are False).
    """

    def __init__(self, size: int) -> None:
        self.values: deque[float] = deque()
        self.size = size
        self.bad = 0
        self.shift: float | None = None
        self.s = self.ss = 0.0

    def __len__(self) -> int:
        return len(self.values)

    def push(self, x: float) -> None:
        if len(self.values) == self.size:
            self._remove(self.values.popleft())
        self.values.append(x)
        if not math.isfinite(x):
            self.bad += 1
            return
        if self.shift is None:
            self.shift = x
        d = x - self.shift
        self.s += d
        self.ss += d * d

    def _remove(self, x: float) -> None:
        if not math.isfinite(x):
            self.bad -= 1
            return
        d = x - (self.shift or 0.0)
        self.s -= d
        self.ss -= d * d

    def mean(self) -> float:
        n = len(self.values)
        return math.nan if self.bad or not n else (self.shift or 0.0) + self.s / n

    def std(self) -> float:
        n = len(self.values)
        if self.bad or n < 2:
            return math.nan
        return math.sqrt(max(0.0, (self.ss - self.s * self.s / n) / (n - 1)))


class _Baseline:
    """What every baseline shares: its alarms come from one episode tracker."""

    def __init__(self) -> None:
        self.ep = _Episodes()

    def alarms(self) -> list[Alarm]:
        return list(self.ep.alarms)


class _Episodes:
    """Turns per-point flags into alarms: one per run of consecutive flagged points."""

    def __init__(self) -> None:
        self.alarms: list[Alarm] = []
        self._on = False

    def flag(self, flagged: bool, step: int, severity: str = "warning") -> None:
        if flagged and not self._on:
            self.alarms.append((None, severity, step))
        self._on = flagged


class KillLossSpike(_Baseline):
    name = "llm-foundry KillLossSpike"

    def __init__(
        self, patience: int = 4, multiplier: float = 2.0, window: int = 100, cap: float = 10.0
    ) -> None:
        self.patience, self.multiplier, self.cap, self.size = patience, multiplier, cap, window
        self.window = Rolling(window)
        self.high: deque[bool] = deque(maxlen=window)
        self.outliers = 0
        self.n = 0
        super().__init__()

    def step(self, rec: StepRecord) -> None:
        if rec.loss is None:
            return
        self.n += 1
        flagged = False
        if len(self.window) == self.size:
            if rec.loss >= self.window.mean() * self.multiplier:
                self.outliers += 1
                flagged = self.outliers > self.patience
            else:
                self.outliers = 0
                flagged = self.n >= 2 * self.size and sum(self.high) >= self.size / 2
        self.ep.flag(flagged, rec.step)
        self.window.push(rec.loss)
        self.high.append(rec.loss > self.cap)


class OlmoSkipStep(_Baseline):
    name = "OLMo-core 6σ"

    def __init__(self, sigma: float = 6.0, window: int = 128) -> None:
        self.sigma, self.size = sigma, window
        self.losses, self.grads = Rolling(window), Rolling(window)
        super().__init__()

    def _out(self, window: Rolling, latest: float) -> bool:
        within = (latest - window.mean()) <= self.sigma * window.std()  # NaN anywhere: False, skipped
        return not within

    def step(self, rec: StepRecord) -> None:
        if rec.loss is None:
            return
        # The window holds the previous values; the rule needs max(20, 64) of them first.
        if len(self.losses) + 1 >= max(20, self.size // 2):
            flagged = self._out(self.losses, rec.loss)
            if rec.grad_norm is not None and len(self.grads) >= 2:
                flagged = flagged or self._out(self.grads, rec.grad_norm)
            self.ep.flag(flagged, rec.step)
        self.losses.push(rec.loss)
        if rec.grad_norm is not None:
            self.grads.push(rec.grad_norm)


class MegatronChecks(_Baseline):
    name = "Megatron 10x"

    def __init__(self, factor: float = 10.0, samples: int = 100) -> None:
        self.factor, self.samples = factor, samples
        self.early: list[float] = []
        super().__init__()

    def step(self, rec: StepRecord) -> None:
        if rec.loss is None:
            return
        bad = not math.isfinite(rec.loss) or (rec.grad_norm is not None and not math.isfinite(rec.grad_norm))
        if bad:
            self.ep.flag(True, rec.step, "critical")  # fatal: the run stops
            return
        if len(self.early) < self.samples:
            self.early.append(rec.loss)
            self.ep.flag(False, rec.step)
            return
        self.ep.flag(rec.loss > self.factor * max(self.early), rec.step, "critical")


class WandbZScore(_Baseline):
    name = "W&B z-score"

    def __init__(self, window: int = 30, threshold: float = 3.0) -> None:
        self.size, self.threshold = window, threshold
        self.windows = {"loss": Rolling(window), "grad_norm": Rolling(window)}
        self.eps = {m: _Episodes() for m in self.windows}
        super().__init__()

    def alarms(self) -> list[Alarm]:
        return sorted((a for ep in self.eps.values() for a in ep.alarms), key=lambda a: a[2])

    def step(self, rec: StepRecord) -> None:
        for metric, window in self.windows.items():
            x = getattr(rec, metric)
            if x is None:
                continue
            if len(window) == self.size:
                sd = window.std()
                self.eps[metric].flag(sd > 0 and (x - window.mean()) / sd > self.threshold, rec.step)
            window.push(x)


class NaiveThresholds:
    name = "naive thresholds"

    def __init__(self) -> None:
        self.prev: float | None = None
        self.last_ts: float | None = None
        self.last_step = 0
        self.loss_ep, self.grad_ep, self.mem_ep = _Episodes(), _Episodes(), _Episodes()
        self.sys_ep, self.stall_ep = _Episodes(), _Episodes()
        self.total: int | None = None

    def alarms(self) -> list[Alarm]:
        eps = (self.loss_ep, self.grad_ep, self.mem_ep, self.sys_ep, self.stall_ep)
        return sorted((a for ep in eps for a in ep.alarms), key=lambda a: a[2])

    def step(self, rec: StepRecord) -> None:
        self.last_ts, self.last_step = rec.ts, rec.step
        if rec.loss is not None:
            x = rec.loss
            flag = not math.isfinite(x) or x == 0.0 or (self.prev is not None and x > 2.0 * self.prev)
            self.loss_ep.flag(flag, rec.step)
            if math.isfinite(x):
                self.prev = x
        if rec.grad_norm is not None:
            self.grad_ep.flag(not math.isfinite(rec.grad_norm) or rec.grad_norm > 10.0, rec.step)
        if rec.mem_reserved_bytes and self.total:
            self.mem_ep.flag(rec.mem_reserved_bytes > 0.95 * self.total, rec.step)

    def system(self, s: SystemSample, step: int) -> None:
        hot = any((g.temperature_c or 0) > 85 for g in s.gpus)
        disk = s.disk_total_bytes and (s.disk_free_bytes or 0) < 0.05 * s.disk_total_bytes
        self.total = max((g.mem_total_bytes or 0 for g in s.gpus), default=0) or self.total
        self.sys_ep.flag(bool(hot or disk), step)

    def time(self, now: float, step: int) -> None:
        if self.last_ts is not None:
            self.stall_ep.flag(now - self.last_ts > 600, step)


BASELINES = (KillLossSpike, OlmoSkipStep, MegatronChecks, WandbZScore, NaiveThresholds)


def baseline_alarms(cls: type, events: Iterable[tuple[str, Any]]) -> list[Alarm]:
    """Run one baseline over an event stream (primary rank only, as a callback on rank 0 would)."""
    det = cls()
    step = 0
    for kind, item in events:
        if kind == "step" and item.rank == 0:
            step = item.step
            det.step(item)
        elif kind == "system" and hasattr(det, "system"):
            det.system(item, step)
        elif kind == "time" and hasattr(det, "time"):
            det.time(item[0], step)
    return det.alarms()


def records_events(records: Iterable[StepRecord]) -> list[tuple[str, Any]]:
    return [("step", r) for r in records]
