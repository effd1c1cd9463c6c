"""Trend detectors: plateau, oscillation and overfitting.

They look at the shape of the loss over a window rather than at one point:

- plateau: no learning since the start (the level is within ``plateau_min_gain``
  of where it began once the warm-up is over and enough steps passed), a loss
  that repeats the very same value (a frozen model), or a flat loss while the
  gradients have vanished. A flat stretch *after* the loss fell is convergence,
  not a plateau, so it is never flagged from the loss alone;
- oscillation: the loss swings around its local trend far wider than its
  point-to-point noise (``oscillation_ratio``), crossing the trend band at
  least ``oscillation_crossings`` times, without improving;
- overfitting: eval loss ``rise`` above its best for ``rising_evals`` evaluations
  while the training loss has not risen.
"""

from __future__ import annotations

import math
from collections import deque
from itertools import pairwise

from steadytune.detect.base import Finding, Reporter, rounded
from steadytune.detect.config import EvalConfig, LossConfig
from steadytune.detect.loss import LossPoint
from steadytune.detect.stats import SortedWindow

_START_POINTS = 8
_STRIDE = 4  # oscillation is evaluated every few points: a window scan each step is wasted work


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


class PlateauWatch:
    """No learning: flat since the start, frozen values, or flat with vanished gradients."""

    def __init__(self, cfg: LossConfig, metric: str = "loss", rank: int | None = None) -> None:
        self.cfg = cfg
        self.metric = metric
        self.rep = Reporter(rank)
        self._start: list[float] = []
        self._start_level: float | None = None
        self._first_step: int | None = None
        self._n = 0
        self._recent = SortedWindow(32)
        self._same = 0
        self._last_loss: float | None = None
        self._lr_prev: float | None = None
        self._lr_rising = False
        self._vanish_level: float | None = None

    def observe_lr(self, lr: float) -> None:
        if math.isfinite(lr):
            self._lr_rising = self._lr_prev is not None and lr > self._lr_prev * 1.0001
            self._lr_prev = lr

    def observe(self, lp: LossPoint, grad_vanished: bool, out: list[Finding]) -> None:
        self._same = self._same + 1 if lp.loss == self._last_loss else 1
        self._last_loss = lp.loss
        if self._first_step is None:
            self._first_step = lp.step
        if not lp.accepted:
            return
        self._n += 1
        self._recent.push(lp.y)
        if self._start_level is None:
            self._start.append(lp.y)
            if len(self._start) == _START_POINTS:
                self._start_level = _median(self._start)
        reason, ev = self._why(lp, grad_vanished)
        if reason:
            ev = ev if not self.rep.is_on("plateau", self.metric) else None
            self.rep.report(out, "plateau", self.metric, lp.step, True, evidence=ev)
        elif self.rep.is_on("plateau", self.metric) and self._cleared(lp):
            self.rep.report(out, "plateau", self.metric, lp.step, False)

    def _why(self, lp: LossPoint, grad_vanished: bool) -> tuple[str, dict | None]:
        cfg = self.cfg
        if self._same >= cfg.frozen_points and lp.loss > cfg.collapse_abs:
            return "frozen", {"reason": "identical loss values", "value": rounded(lp.loss), "points": self._same}
        level = self._recent.median()
        if grad_vanished:
            if self._vanish_level is None:
                self._vanish_level = level
            if level > self._vanish_level - cfg.plateau_min_gain and self._n >= _START_POINTS:
                return "vanished", {"reason": "flat loss with vanished gradients", "level": rounded(math.exp(level))}
        else:
            self._vanish_level = None
        if self._start_level is None or self._n < cfg.plateau_min_points or self._lr_rising:
            return "", None
        if lp.step - (self._first_step or 0) < cfg.plateau_min_steps:
            return "", None
        gain = self._start_level - level
        if -cfg.divergence_rise < gain < cfg.plateau_min_gain:
            return "no_learning", {
                "reason": "no learning since the start",
                "start_level": rounded(math.exp(self._start_level)),
                "level": rounded(math.exp(level)),
                "gain_ratio": rounded(math.exp(gain), 4),
                "threshold_ratio": rounded(math.exp(cfg.plateau_min_gain), 4),
                "points": self._n,
            }
        return "", None

    def _cleared(self, lp: LossPoint) -> bool:
        if self._start_level is None:
            return self._same < self.cfg.frozen_points
        gain = self._start_level - self._recent.median()
        return self._same < self.cfg.frozen_points and gain >= 2 * self.cfg.plateau_min_gain


class OscillationWatch:
    """Swings much wider than the point-to-point noise, crossing the trend line again and again.

    For independent noise the spread of the points around their trend equals
    the noise measured from successive differences. A loss that saws up and
    down over several steps has a spread many times its successive
    differences (the von Neumann ratio idea), and crosses a band of one spread
    around the trend line at least ``oscillation_crossings`` times. Both are
    measured inside the same window, so slowly changing noise does not matter.
    A window whose level falls (a staircase, a curve still learning) is not
    judged.
    """

    def __init__(self, cfg: LossConfig, metric: str = "loss", rank: int | None = None) -> None:
        self.cfg = cfg
        self.metric = metric
        self.rep = Reporter(rank)
        self._ys: deque[float] = deque(maxlen=cfg.oscillation_window)
        self._count = 0

    def observe(self, lp: LossPoint, out: list[Finding]) -> None:
        if lp.new_segment:
            self._ys.clear()
        self._ys.append(lp.y)
        self._count += 1
        if len(self._ys) < self._ys.maxlen or self._count % _STRIDE:
            return
        ratio, spread, crossings, improving = oscillation_stats(list(self._ys))
        cfg = self.cfg
        on = self.rep.is_on("oscillation", self.metric)
        sawing = ratio >= cfg.oscillation_ratio and spread >= cfg.oscillation_min_amplitude
        if sawing and crossings >= cfg.oscillation_crossings and not improving:
            ev = None
            if not on:
                ev = {
                    "spread_over_noise": rounded(ratio, 4),
                    "threshold_ratio": cfg.oscillation_ratio,
                    "spread_log": rounded(spread, 4),
                    "crossings": crossings,
                    "window_points": len(self._ys),
                }
            self.rep.report(out, "oscillation", self.metric, lp.step, True, evidence=ev)
        elif on and (improving or ratio < 0.5 * (1.0 + cfg.oscillation_ratio)):
            self.rep.report(out, "oscillation", self.metric, lp.step, False)


def oscillation_stats(ys: list[float]) -> tuple[float, float, int, bool]:
    """(spread / noise, spread, band crossings, level falling) of a window of log-losses."""
    n = len(ys)
    half = n // 2
    m1, m2 = _median(ys[:half]), _median(ys[half:])
    slope = (m2 - m1) / half
    mid, centre = 0.5 * (m1 + m2), (n - 1) / 2.0
    resid = [y - (mid + slope * (i - centre)) for i, y in enumerate(ys)]
    med = _median(resid)
    spread = 1.4826 * _median([abs(r - med) for r in resid])
    noise = _median([abs(b - a) for a, b in pairwise(ys)]) / (0.6745 * math.sqrt(2.0))
    crossings, state = 0, 0
    for r in resid:
        side = 1 if r - med > spread else (-1 if r - med < -spread else 0)
        if side:
            if state and side != state:
                crossings += 1
            state = side
    ratio = spread / noise if noise > 0 else (math.inf if spread > 0 else 0.0)
    return ratio, spread, crossings, m2 < m1 - spread


class OverfitWatch:
    """Eval loss rising above its best while the training loss does not rise."""

    def __init__(self, cfg: EvalConfig, metric: str = "eval_loss", rank: int | None = None) -> None:
        self.cfg = cfg
        self.metric = metric
        self.rep = Reporter(rank)
        self._n = 0
        self._best: float | None = None
        self._best_step = 0
        self._train_at_best: float | None = None
        self._above = 0

    def observe(self, step: int, value: float, train_level: float | None, out: list[Finding]) -> None:
        if not math.isfinite(value) or value <= 0:
            return
        y = math.log(value)
        self._n += 1
        if self._best is None or y < self._best:
            self._best, self._best_step, self._train_at_best = y, step, train_level
            self._above = 0
            self.rep.report(out, "overfitting", self.metric, step, False)
            return
        rise = y - self._best
        self._above = self._above + 1 if rise > self.cfg.rise else 0
        train_ok = train_level is None or self._train_at_best is None or train_level <= self._train_at_best
        if self._n >= self.cfg.min_evals and self._above >= self.cfg.rising_evals and train_ok:
            ev = None
            if not self.rep.is_on("overfitting", self.metric):
                ev = {
                    "value": rounded(value),
                    "best": rounded(math.exp(self._best)),
                    "best_step": self._best_step,
                    "rise_ratio": rounded(math.exp(rise), 4),
                    "threshold_ratio": rounded(math.exp(self.cfg.rise), 4),
                    "evals_above": self._above,
                }
            self.rep.report(out, "overfitting", self.metric, step, True, evidence=ev)
        elif rise <= 0.5 * self.cfg.rise:
            self.rep.report(out, "overfitting", self.metric, step, False)
