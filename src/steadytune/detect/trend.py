"""Trend detectors: plateau and oscillation (overfitting, on the eval loss, is in ``detect.overfit``).

They look at the shape of the loss over a window rather than at one point:

- plateau: no learning since the start (``plateau_min_points`` points after
  the LR warm-up ended, the level is within ``plateau_min_gain`` of where it
  began and a least-squares fit over the whole span shows it, and again once the span
  has tripled; only in a log that begins where the run began), a loss that repeats
  the very same value (a frozen model), or a flat loss while the gradients have vanished. A flat stretch
  *after* the loss fell is convergence, not a plateau, so it is never flagged
  from the loss alone;
- oscillation: new swings, much wider than the noise before them, regular
  (points half a period apart differ far more than points a period apart)
  and repeated, without improving.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

from steadytune.detect.base import Finding, KindInfo, Reporter, rounded
from steadytune.detect.points import LossPoint, Signal

_START_POINTS = 8
_STRIDE = 4  # oscillation is evaluated every few points: a window scan each step is wasted work
# The texture before a window is also read over this many whole windows before it (one width per
# window): the few overlapping windows just before it hold about two windows' worth of points, and
# their median width is itself noisy (a 32-point interquartile width varies by ~20%), so a quiet stretch
# just before an ordinary one made noise look 2.2x wider now and then (1 call in a million healthy points).
_LONG_WINDOWS = 16
_WARMUP_SPANS = 2  # a plateau is judged over at least this many warm-ups' worth of steps after it
# A start shown flat is called a plateau only once it is shown flat again after the span since the first
# step has grown this many times over. The fit bounds a change to what the noise lets it see; a steady
# decline too slow to see yet (the first few hundred steps of a long run, or its first 3% after a 1% LR
# warm-up under 10% noise) shows as the span grows, since the slope's t grows as the span to the power
# 1.5: a decline at t -0.9 when first shown flat is expected at t -4.7 by three times the span. A run
# that learns nothing stays flat however long it is watched, so it is still called, later.
_CONFIRM_SPAN = 3.0
_PRECISE_SHARE = 0.1  # a fit that could see a fall of this share of plateau_min_gain and sees none: enough
# A loss "the same" as the one before: within a hundredth of a percent. Real batches differ by far more
# (the quietest real losses, pretraining on millions of tokens a step, vary by 0.3-1% a point).
_SAME_REL = 1e-4
# A repeated value says the model is frozen only in a log whose values, before the repeats began, were
# the same twice in a row at most once in twenty pairs (six in a row at that rate is a 1-in-3-million
# event). One that repeats more often (a logger that prints a value until it is replaced, a coarse
# dtype or three printed digits that hold a slowly falling loss on one value for a while) cannot show
# a frozen model by its repeats.
_COARSE_SHARE = 0.05
# A log that begins this many logging intervals after step 0 (or after its first epoch) began after
# the run did: what the run learned before it is not in it, so "no learning since the start" is not said.
_LATE_START_INTERVALS = 5


KINDS: dict[str, KindInfo] = {
    "plateau": KindInfo(
        "loss is flat",
        "a flat line: no learning, from vanishing gradients, a frozen model (no trainable parameters, "
        "LoRA not attached) or an LR of zero",
        "check that parameters require grad and that the optimizer holds them; check the LR schedule; "
        "raise the LR",
        "warning",
    ),
    "oscillation": KindInfo(
        "loss oscillates",
        "a sawtooth: the LR is too high, so each update overshoots",
        "lower the LR (x0.3-0.5) or lengthen the warm-up; check the batch size",
        "warning",
    ),
}


def _median(xs: list[float]) -> float:
    return _sorted_median(sorted(xs))


def _sorted_median(s: list[float]) -> float:
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


@dataclass(frozen=True, slots=True)
class PlateauLimits:
    """As ``detect.loss`` names them (docs/detectors.md)."""

    frozen_points: int
    collapse_abs: float
    plateau_min_points: int
    plateau_min_steps: int
    plateau_min_gain: float
    plateau_trend_t: float
    divergence_rise: float


class PlateauWatch:
    """No learning: flat since the start, frozen values, or flat with vanished gradients."""

    reports: ClassVar[tuple[str, ...]] = ("plateau",)

    def __init__(self, limits: PlateauLimits, metric: str = "loss", rank: int | None = None) -> None:
        self.metric = metric
        self.rep = Reporter(rank)
        self.lim = limits
        self._start: list[float] = []
        self._start_level: float | None = None
        self._first_step: int | None = None
        self._n = 0
        self._level = 0.0
        self._same = 0
        self._anchor: float | None = None  # the first value of the current run of repeats
        self._pairs = 0  # pairs of points in a row before the current run of repeats began
        self._repeats = 0  # of them, pairs that were the same
        self._first_epoch: float | None = None
        self._epoch_progress = (
            False  # an epoch seen between whole numbers: the field is progress, not a counter
        )
        self._points = 0  # loss points seen, accepted or not
        self._lr_prev: float | None = None
        self._lr_rising = False
        self._since_warmup = 0  # accepted points since the LR last rose
        self._warm_end: int | None = None  # the step at which the LR last rose
        self._vanish_level: float | None = None
        self._fit = [0.0] * 6  # n, Σx, Σy, Σxy, Σx², Σy² of (step, log-loss) since the start
        self._flat_since: int | None = None  # the step since which the fit has shown the start flat
        self._zero_log = math.log(max(limits.collapse_abs, 1e-12))

    def observe(self, point: Signal, out: list[Finding]) -> None:
        """Note the step's LR (a warm-up is no plateau), then judge the loss series' level."""
        lr = point.rec.lr
        if lr is not None and math.isfinite(lr):
            self._lr_rising = self._lr_prev is not None and lr > self._lr_prev * 1.0001
            self._lr_prev = lr
        lp = point.loss
        if lp is None:
            if not point.by_loss_rules and self.rep.on:
                self.rep.end_all(out, point.rec.step)  # a loss that turned out to be no cross-entropy
            return
        level, grad_vanished = point.level_of.level, point.grad_vanished
        # The run of values the same as its first (within _SAME_REL), counted here: this runs for
        # every point of the loss.
        loss, anchor = lp.loss, self._anchor
        if anchor is None:
            self._anchor, self._same = loss, 1
        elif abs(loss - anchor) <= _SAME_REL * abs(anchor):
            self._same += 1
        else:
            # The run that just ended, and the change that ended it, join the record of the log.
            self._pairs += self._same
            self._repeats += self._same - 1
            self._anchor, self._same = loss, 1
        self._points += 1
        if self._first_step is None:
            self._first_step = lp.step
            self._first_epoch = point.rec.epoch
        epoch = point.rec.epoch
        if epoch is not None and not self._epoch_progress:
            self._epoch_progress = epoch != math.floor(epoch)
        if not lp.accepted:
            return
        self._n += 1
        self._since_warmup = 0 if self._lr_rising else self._since_warmup + 1
        if self._lr_rising:
            self._warm_end = lp.step
        self._level = level
        x, f = float(lp.step - self._first_step), self._fit
        f[0] += 1.0
        f[1] += x
        f[2] += lp.y
        f[3] += x * lp.y
        f[4] += x * x
        f[5] += lp.y * lp.y
        if self._start_level is None:
            self._start.append(lp.y)
            if len(self._start) == _START_POINTS:
                self._start_level = _median(self._start)
        reason, ev = self._why(lp, grad_vanished)
        if reason:
            on = self.rep.is_on("plateau", self.metric)
            ev = ev if not on else None
            # A flat start is dated where it was first shown flat: it has been so since then.
            at = self._flat_since if reason == "no_learning" and not on and self._flat_since else lp.step
            self.rep.report(out, "plateau", self.metric, at, True, evidence=ev)
        elif self.rep.on and self.rep.is_on("plateau", self.metric) and self._cleared(lp):
            self.rep.report(out, "plateau", self.metric, lp.step, False)

    @property
    def _frozen_after(self) -> int | float:
        """Repeats in a row that show a frozen model; never in a log that repeats values by itself."""
        if self._repeats > _COARSE_SHARE * self._pairs:
            return math.inf
        return self.lim.frozen_points

    def _late_start(self, step: int) -> bool:
        """The log began after the run did: past its first epoch, or many logging intervals in."""
        # Only where the epoch is progress (HF: 1.25): a counter printed from 1 ("Epoch [1/1]") says 1
        # from the first step of the run.
        if self._first_epoch is not None and self._first_epoch >= 1.0 and self._epoch_progress:
            return True
        first = self._first_step or 0
        interval = (step - first) / max(1, self._points - 1)
        return interval > 0 and first > _LATE_START_INTERVALS * interval

    def _why(self, lp: LossPoint, grad_vanished: bool) -> tuple[str, dict | None]:
        # _frozen_after is frozen_points or never: the count alone rules most points out.
        same = self._same
        if same >= self.lim.frozen_points and same >= self._frozen_after and lp.loss > self.lim.collapse_abs:
            return "frozen", {
                "reason": "identical loss values",
                "value": rounded(lp.loss),
                "points": self._same,
            }
        level = self._level
        if grad_vanished:
            if self._vanish_level is None:
                self._vanish_level = level
            if level > self._vanish_level - self.lim.plateau_min_gain and self._n >= _START_POINTS:
                return "vanished", {
                    "reason": "flat loss with vanished gradients",
                    "level": rounded(math.exp(level)),
                }
        else:
            self._vanish_level = None
        start, flat = self._start_level, self._flat_start(lp.step)
        if start is None or flat is False:
            self._flat_since = None
            return "", None
        if self._flat_since is None and flat:
            self._flat_since = lp.step
        if not flat or self._flat_since is None or not self._confirmed(lp.step, self._flat_since):
            return "", None
        gain, (change, _se, _t) = start - level, self.trend()
        return "no_learning", {
            "reason": "no learning since the start",
            "start_level": rounded(math.exp(start)),
            "level": rounded(math.exp(level)),
            "gain_ratio": rounded(math.exp(gain), 4),
            "fitted_change_ratio": rounded(math.exp(change), 4),
            "threshold_ratio": rounded(math.exp(self.lim.plateau_min_gain), 4),
            "points": self._n,
            "flat_since_step": self._flat_since,
        }

    def _confirmed(self, step: int, flat_since: int) -> bool:
        """A start shown flat at ``flat_since`` (and again now) has been watched long enough to be called so.

        When the span since the first step has grown ``_CONFIRM_SPAN`` times over; at once when the fit
        could see a fall of a tenth of the gain expected of learning (1.5 standard errors) and sees no
        fall at all: a decline hiding under that would take ten such spans to be learning. A logged LR
        warm-up is no clock enough: under 10% noise a loss falling 30% over a run is still flat over
        the three warm-ups' worth of steps after a 1% warm-up.
        """
        first = self._first_step or 0
        change, se, _t = self.trend()
        if change >= 0 and 1.5 * se <= _PRECISE_SHARE * self.lim.plateau_min_gain:
            return True
        return step - first >= _CONFIRM_SPAN * (flat_since - first)

    def _flat_start(self, step: int) -> bool | None:
        """True: the loss is shown flat since the start at this point (every gate passed, the fit shows it).
        False: not judged here, or the level shows the run has learned. None: not shown flat at this point
        (the fit's bound widened, or its slope falls at t below -``plateau_trend_t``): a start shown flat
        before stays a candidate, called only when shown flat again (a real decline keeps its t falling,
        as the span to the power 1.5; a flat run's t only wanders)."""
        level = self._level
        # The LR warm-up is not a plateau: judge only once the full LR had time to act, for twice as
        # many steps as the warm-up took. Schedules warm up over a share of the run (1-10%), so the
        # warm-up is the run's own clock: a curve falling 30% over 100,000 steps under 3% noise is flat
        # over the thousand steps after a 1% warm-up (0.3% down, inside the fit's 1.5 standard errors),
        # and its fall shows only over the next two thousand.
        if self._start_level is None or self._since_warmup < self.lim.plateau_min_points:
            return False
        warm = (self._warm_end or 0) - (self._first_step or 0)
        if self._warm_end is not None and step - self._warm_end < _WARMUP_SPANS * warm:
            return False
        if step - (self._first_step or 0) < self.lim.plateau_min_steps:
            return False
        gain = self._start_level - level
        if gain <= -self.lim.divergence_rise:
            return False  # climbed: a divergence, reported as such
        learned = gain >= self.lim.plateau_min_gain
        if learned and gain >= self._learned_gain():
            return False  # the usual exit: the run has learned
        if self._late_start(step):
            return False  # the start of the log is not the start of the run
        if learned:
            # Short of the learned gain, a dip of the noise can reach as far down: shown neither way yet.
            return None
        if level <= self._zero_log:
            return False  # a loss at zero is a collapse, reported as such
        # Flatness must be shown, not just unproven learning: the change fitted over the whole
        # span, less 1.5 standard errors, must still fall short of the gain we expect. Noisy
        # runs therefore need more points before a plateau is called.
        change, se, t = self.trend()
        if t < -self.lim.plateau_trend_t:
            return None  # a decline the noise lets be seen (learning, however slow) or a dip of a flat run
        if change - 1.5 * se < -self.lim.plateau_min_gain or se > self.lim.plateau_min_gain:
            return None
        return True

    def trend(self) -> tuple[float, float, float]:
        """Least-squares change of log-loss over the span since the start: (change, its SE, t)."""
        n, sx, sy, sxy, sxx, syy = self._fit
        if n < 3:
            return 0.0, math.inf, 0.0
        vxx, vxy, vyy = sxx - sx * sx / n, sxy - sx * sy / n, syy - sy * sy / n
        if vxx <= 0:
            return 0.0, math.inf, 0.0
        slope = vxy / vxx
        resid = max(vyy - slope * vxy, 0.0) / (n - 2)
        span = math.sqrt(12.0 * vxx / n)  # the span of evenly spread steps with this variance
        se = math.sqrt(resid / vxx)
        t = slope / se if se > 0 else (0.0 if slope == 0 else math.copysign(math.inf, slope))
        return slope * span, se * span, t

    def _cleared(self, lp: LossPoint) -> bool:
        if self._start_level is None:
            return self._same < self._frozen_after
        gain = self._start_level - self._level
        return self._same < self._frozen_after and gain >= self._learned_gain()

    def _learned_gain(self) -> float:
        """How far below the start the level must be to have learned, not dipped with the noise.

        Two medians of 8 noisy points differ by about 0.63 sigma by chance: a gain of four of those
        is learning, not a dip of the noise (which would flap the plateau on and off).
        """
        # The noise is the per-point scatter of log-loss around the fitted line (0 until three points),
        # worked out here: the usual exit from the plateau rule reads it at every point.
        n, sx, sy, sxy, sxx, syy = self._fit
        noise = 0.0
        if n >= 3:
            vxx, vxy, vyy = sxx - sx * sx / n, sxy - sx * sy / n, syy - sy * sy / n
            slope = vxy / vxx if vxx > 0 else 0.0
            noise = math.sqrt(max(vyy - slope * vxy, 0.0) / (n - 2))
        return 2 * self.lim.plateau_min_gain + 4.0 * 0.63 * noise


@dataclass(frozen=True, slots=True)
class OscillationLimits:
    """As ``detect.loss`` names them (docs/detectors.md)."""

    oscillation_window: int
    oscillation_ratio: float
    oscillation_growth: float
    oscillation_min_amplitude: float
    oscillation_crossings: int


class OscillationWatch:
    """Swings that are new, wide and regular: the LR saws the loss up and down.

    Four tests over the window, all needed:

    - *new and wide*: the window's interquartile width is
      ``oscillation_growth`` times the typical width of the windows before it
      (a run that always had this texture, such as a length-grouped
      sawtooth, is not sawing because of its LR);
    - *regular*: the differences between points k apart (a variogram) vary
      with k by ``oscillation_ratio`` or more: a swing of period P differs
      most at P/2 and cancels at P, while noise, however heavy-tailed (DPO),
      differs alike at every lag;
    - *symmetric*: the swing reaches as far below the trend as above it (within 2x);
      outlier batches stick out upwards only;
    - *repeated*: the loss crosses the band of half a spread around the trend at
      least ``oscillation_crossings`` times (two full cycles), without the
      level falling (a staircase or a curve still learning is not judged).
    """

    reports: ClassVar[tuple[str, ...]] = ("oscillation",)

    def __init__(self, limits: OscillationLimits, metric: str = "loss", rank: int | None = None) -> None:
        self.metric = metric
        self.rep = Reporter(rank)
        self.lim = limits
        oscillation_window = limits.oscillation_window
        self._ys: deque[float] = deque(maxlen=oscillation_window)
        # The interquartile width of the window at each evaluation, over two windows: the
        # typical (median) one of those from before the current window is the texture before.
        self._widths: deque[float] = deque(maxlen=2 * oscillation_window // _STRIDE + 1)
        # The first widths of those, sorted (the windows before the current one): each evaluation
        # moves one width in and, once the widths are full, one out.
        self._older: list[float] = []
        # One width per whole window: (the point count it ended at, its width).
        self._long: deque[tuple[int, float]] = deque(maxlen=_LONG_WINDOWS)
        # The median width of the whole windows that ended a window or more ago (None: under four),
        # and the whole windows it was taken over: it changes only when a whole window ends.
        self._long_key: int | None = None
        self._long_width: float | None = None
        self._count = 0
        self._epoch: int | None = None
        self._boundary = -(10**9)  # the point count at the last epoch boundary
        self._recent_calls = 0  # bits: the last evaluations that looked like sawing

    def observe(self, point: Signal, out: list[Finding]) -> None:
        lp, epoch = point.loss, point.rec.epoch
        if lp is None:
            if not point.by_loss_rules and self.rep.on:
                self.rep.end_all(out, point.rec.step)  # a loss that turned out to be no cross-entropy
            return
        if lp.new_segment:
            self._ys.clear()
            self._widths.clear()
            self._older.clear()
            self._long.clear()
            self._long_key = None
            self._count = 0
            self._boundary = -(10**9)
        if epoch is not None:
            whole = math.floor(epoch)
            if self._epoch is not None and whole != self._epoch:
                self._boundary = self._count  # a staircase step may sit in the window: no detrend models it
            self._epoch = whole
        self._ys.append(lp.y)
        self._count += 1
        if self._count % _STRIDE or len(self._ys) < (self._ys.maxlen or 0):
            return
        ordered = sorted(self._ys)
        n = len(ordered)
        width = ordered[(3 * n) // 4] - ordered[n // 4]
        widths, kept = self._widths, self._older
        older = len(widths) - n // _STRIDE  # widths of windows that ended before this one began
        while len(kept) < older:
            insort(kept, widths[len(kept)])
        before = _sorted_median(kept) if older > 0 else None
        long_ago = self._long_ago(n)
        if before is not None and long_ago is not None:
            before = max(before, long_ago)
        if kept and len(widths) == widths.maxlen:
            del kept[bisect_left(kept, widths[0])]  # the oldest width leaves with the append below
        widths.append(width)
        if self._count % n == 0:
            self._long.append((self._count, width))
            self._long_key = None
        if before is None or self._count - self._boundary <= n:
            return  # judged against the texture before, and never across an epoch boundary
        # Like is compared with like (the same width statistic), so a texture the run always
        # had is not new; most windows stop at this cheap test.
        grown = width >= self.lim.oscillation_growth * before
        if not grown and not self.rep.on:
            self._recent_calls = (self._recent_calls << 1) & 0b111
            return
        w = WindowShape(list(self._ys))
        regular = (
            grown
            and w.spread >= self.lim.oscillation_min_amplitude
            and not w.falling
            and w.steady()
            and w.symmetric()
            and w.crossings() >= self.lim.oscillation_crossings
            and w.variogram_ratio() >= self.lim.oscillation_ratio
        )
        on = self.rep.is_on("oscillation", self.metric)
        # Two of the last three evaluations: a swing that saws keeps sawing, a transient does not.
        self._recent_calls = ((self._recent_calls << 1) | regular) & 0b111
        if regular and (on or bin(self._recent_calls).count("1") >= 2):
            ev = None
            if not on:
                ev = {
                    "spread_log": rounded(w.spread, 4),
                    "width_before_log": rounded(before, 4),
                    "width_log": rounded(width, 4),
                    "variogram_ratio": rounded(w.variogram_ratio(), 4),
                    "crossings": w.crossings(),
                    "window_points": len(self._ys),
                }
            self.rep.report(out, "oscillation", self.metric, lp.step, True, evidence=ev)
        elif on and (w.falling or w.crossings() < self.lim.oscillation_crossings // 2):
            self.rep.report(out, "oscillation", self.metric, lp.step, False)

    def _long_ago(self, n: int) -> float | None:
        """The median width of the whole windows that ended at least a window (``n`` points) before now.

        They end at multiples of ``n``, so which of them are that old changes only when the count
        passes a multiple of ``n``; kept until then (or until a whole window is added or the
        segment ends).
        """
        key = (self._count - n) // n
        if key != self._long_key:
            limit = self._count - n
            widths = [w for end, w in self._long if end <= limit]
            self._long_key, self._long_width = key, _median(widths) if len(widths) >= 4 else None
        return self._long_width


@lru_cache(maxsize=4)
def _quadratic_basis(n: int) -> tuple[tuple[float, ...], ...]:
    """Orthonormal vectors spanning 1, x, x^2 over n points (Gram-Schmidt), for least-squares detrending."""
    basis: list[list[float]] = []
    for power in range(3):
        v = [float(i) ** power for i in range(n)]
        for q in basis:
            dot = sum(a * b for a, b in zip(v, q, strict=True))
            v = [a - dot * b for a, b in zip(v, q, strict=True)]
        norm = math.sqrt(sum(a * a for a in v))
        basis.append([a / norm for a in v])
    return tuple(tuple(q) for q in basis)


class WindowShape:
    """Trend-removed shape of a window of log-losses, computed lazily (most windows stop at the spread).

    The trend is a least-squares quadratic, so the bend of a curve that is still
    learning (or of a DPO loss leaving ln 2) is not taken for a swing; a swing
    of two or more cycles in the window is left almost whole. The spread is the
    robust (MAD) width of what remains.
    """

    __slots__ = ("falling", "resid", "spread", "ys")

    def __init__(self, ys: list[float]) -> None:
        n = len(ys)
        half = n // 2
        resid = list(ys)
        for q in _quadratic_basis(n):
            dot = sum(a * b for a, b in zip(ys, q, strict=True))
            resid = [r - dot * b for r, b in zip(resid, q, strict=True)]
        med = _median(resid)
        self.ys = ys
        self.resid = [r - med for r in resid]
        self.spread = 1.4826 * _median([abs(r) for r in self.resid])
        self.falling = _median(ys[half:]) < _median(ys[:half]) - 0.5 * self.spread

    def steady(self) -> bool:
        """The swing fills the window: each half spreads at least half as wide as the other.

        Noise that is still growing (a DPO loss leaving ln 2) spreads unevenly and
        would make any lag statistic look structured.
        """
        half = len(self.resid) // 2
        a = _median([abs(r) for r in self.resid[:half]])
        b = _median([abs(r) for r in self.resid[half:]])
        return min(a, b) >= 0.5 * max(a, b)

    def symmetric(self) -> bool:
        """A swing goes as far down as up; a few bad batches stick out on one side only.

        Per-step losses with outliers (some batches 2-3x the rest) fill a window with
        jumps that a lag statistic may find regular; they spread the upper tail alone.
        """
        r = sorted(self.resid)
        n = len(r)
        up, down = r[(85 * n) // 100] - r[n // 2], r[n // 2] - r[(15 * n) // 100]
        return min(up, down) >= 0.5 * max(up, down)

    def variogram_ratio(self) -> float:
        """Largest over smallest median |r[i+k] - r[i]| for lags k = 1..n/4.

        Independent noise differs alike at every lag (ratio near 1); a swing of
        period P differs most at P/2 and least at P, where it cancels out.
        """
        r = self.resid
        n = len(r)
        gam = [_median([abs(r[i + k] - r[i]) for i in range(n - k)]) for k in range(1, n // 4 + 1)]
        low = min(gam)
        return max(gam) / low if low > 0 else math.inf

    def crossings(self) -> int:
        """Alternations across a band of half a spread (a sine's spread is about its amplitude)."""
        band = 0.5 * self.spread
        crossings, state = 0, 0
        for r in self.resid:
            side = 1 if r > band else (-1 if r < -band else 0)
            if side:
                if state and side != state:
                    crossings += 1
                state = side
        return crossings
