"""The parts of the loss series that serve one rule each (:class:`~steadytune.detect.loss.LossWatch`).

- :class:`SuddenCollapse`: ``loss_collapse`` from a loss at zero or one that fell
  ``collapse_drop`` (log) below its level in one go;
- :class:`ClimbFit`: the line through the last two level windows of accepted points,
  which tells a steady climb (a ``divergence``) long before the level is far up;
- :class:`SeasonalExcuse`: the previous epoch's level at the same phase, which
  excuses the jump back up at an epoch boundary of a multi-epoch run;
- :class:`RecoveredTail`: the one-point excursions the run came back from at once,
  which make the next one no higher a point for the point after it to judge.

They share the loss series' tracker and reporter (one anomaly per kind and metric),
and keep the state only they read.
"""

from __future__ import annotations

import math
import operator
from collections import deque
from dataclasses import dataclass

from steadytune.detect.base import Finding, Reporter, rounded
from steadytune.detect.stats import Tracker


@dataclass(frozen=True, slots=True)
class LossLimits:
    """The loss series' own thresholds, as ``detect.loss`` names them (docs/detectors.md)."""

    spike_min_ratio_confirmed: float
    young_spike_z: float
    resolve_z: float
    suspect_z: float
    divergence_points: int
    divergence_rise: float
    climb_min_rise: float
    climb_t: float
    early_rise: float
    collapse_abs: float
    collapse_drop: float
    collapse_small: float
    collapse_points: int
    seasonal_margin: float


_ZERO_POINTS = 2  # a loss at zero this many points in a row has collapsed
_CHANCE = 0.01  # a run of near-zero points this unlikely by chance, over the whole log, is a collapse
_RATE_POINTS = 50  # points seen before a rate of near-zero points is trusted
_MAX_RATE = 0.5  # a loss near zero this often is judged by its fall, not its visits to zero
_MAX_NEED = 32  # the longest run ever asked for: a collapse lasts


class SuddenCollapse:
    """loss_collapse: a loss at zero, or one that fell far below its level and stayed there."""

    __slots__ = (
        "_drop",
        "_lim",
        "_rep",
        "_spike_z",
        "_t",
        "drop_run",
        "metric",
        "n_low",
        "n_seen",
        "zero_run",
        "zero_since",
    )

    def __init__(
        self, limits: LossLimits, spike_z: float, rep: Reporter, tracker: Tracker, metric: str
    ) -> None:
        self._lim, self._spike_z, self._rep, self._t, self.metric = limits, spike_z, rep, tracker, metric
        self._drop = limits.collapse_drop
        self.drop_run = 0  # points in a row that dropped that far
        # Points in a row at zero: one alone is no collapse. A batch-size-1 reward model's loss
        # of 1 - margin rounds to 0.0 in bf16 now and then, and a script may print a placeholder
        # 0.0 between real values; a loss that collapsed stays there.
        self.zero_run = 0
        self.zero_since = 0  # the step of the first of them: the collapse is dated there
        # How often this loss was near zero before: a run of such points is a collapse only when
        # chance would not give one that long (a batch-size-1 reward model near 100 % accuracy
        # reads 0.0 or 0.004 on 8 % of its steps, several in a row now and then).
        self.n_seen = 0
        self.n_low = 0

    def judge(self, step: int, loss: float, y: float, out: list[Finding]) -> bool:
        """True when this point is (a candidate for) a collapse: it stays out of the baseline."""
        t, lim = self._t, self._lim
        drop = max(self._drop, self._spike_z * t.sigma)
        dropped = t.n_level > 0 and loss <= lim.collapse_small and (t.level - y) > drop
        self.drop_run = self.drop_run + 1 if dropped else 0
        zero = loss <= lim.collapse_abs
        self.zero_run = self.zero_run + 1 if zero else 0
        if self.zero_run == 1:
            self.zero_since = step
        low = loss <= lim.collapse_small
        run = max(self.zero_run, self.drop_run)
        need = self._points_needed(run - 1) if run else 0  # the run's earlier points are counted
        self.n_seen += 1
        self.n_low += low
        active = self.zero_run >= max(_ZERO_POINTS, need) or self.drop_run >= max(lim.collapse_points, need)
        if active:
            first = not self._rep.is_on("loss_collapse", self.metric)
            ev = None
            if first:
                ev = {
                    "value": rounded(loss),
                    "baseline": rounded(math.exp(t.level)) if t.n_level else None,
                    "threshold_abs": lim.collapse_abs,
                    "threshold_drop_ratio": rounded(math.exp(self._drop), 4),
                }
            at = self.zero_since if first and self.zero_run >= _ZERO_POINTS else step
            self._rep.report(out, "loss_collapse", self.metric, at, True, evidence=ev)
        elif not dropped:
            self._rep.report(out, "loss_collapse", self.metric, step, False)
        return dropped or zero

    def _points_needed(self, run: int) -> int:
        """The shortest run of near-zero points that chance would give with probability under
        ``_CHANCE`` in a log this long, at the rate such points came before this run (0 before any).
        ``run``: the run's points already counted (all of them near zero)."""
        before = self.n_seen - run
        low = self.n_low - run
        if before < _RATE_POINTS or low <= 0:
            return 0
        rate = low / before
        if rate >= _MAX_RATE:
            return _MAX_NEED
        return min(_MAX_NEED, math.ceil(math.log(_CHANCE / before) / math.log(rate)))


class ClimbFit:
    """The accepted points of a segment over two level windows, and whether they climb along a line."""

    __slots__ = ("_min_rise", "_rise_slope", "_sxx", "_t", "_w", "rising", "ys")

    def __init__(self, level_window: int, climb_min_rise: float, climb_t: float) -> None:
        n = 2 * level_window
        self.ys: deque[float] = deque(maxlen=n)
        self._sxx = n * (n * n - 1) / 12.0
        # Centred positions: Σ w·y is the fit's Σ(x - x̄)(y - ȳ) in one C-level pass.
        self._w = tuple(i - 0.5 * (n - 1) for i in range(n))
        self._rise_slope = climb_min_rise / (n - 1)  # the least slope that is a climb
        self._min_rise, self._t = climb_min_rise, climb_t
        self.rising = False  # the last look at the window saw a steady climb

    def clear(self) -> None:
        """A new segment, or a climb taken out of the level: the line starts again."""
        self.ys.clear()
        self.rising = False

    def look(self, y: float) -> None:
        """Look at the line again, ``y`` its newest point.

        A line that rises ``climb_min_rise`` with t >= ``climb_t`` has its last point at
        least half that above its first: the cheap test first (a noisy flat run passes
        it a third of the time), the fit only then.
        """
        self.rising = y - self.ys[0] > 0.5 * self._min_rise and self.steady_rise()

    def steady_rise(self) -> bool:
        """The last two level windows rise along a line: by ``climb_min_rise`` and with a t of ``climb_t``.

        A steady climb is known long before its level is 1.42x its best: noise rarely lines
        sixteen points up (t 8 with 14 degrees of freedom is a chance of 6 in 10 million; t 6,
        1.6 in 100,000, was reached by a healthy run in the synthetic suite), and healthy curves
        fall or stay flat between epochs. Only accepted points enter, so a spike cannot tilt
        the line.
        """
        ys = self.ys
        n = len(ys)
        if n < (ys.maxlen or 0):
            return False
        sxy = sum(map(operator.mul, self._w, ys))
        slope = sxy / self._sxx
        if slope < self._rise_slope:
            return False  # most looks end here
        my = sum(ys) / n
        resid = max(sum((y - my) ** 2 for y in ys) - slope * sxy, 0.0) / (n - 2)
        return slope * math.sqrt(self._sxx) >= self._t * math.sqrt(resid)


class SeasonalExcuse:
    """How high the previous epoch was at the same phase: a healthy sawtooth is no spike."""

    __slots__ = ("_epoch", "_margin", "_offsets", "_resolve_z", "_t")

    def __init__(self, tracker: Tracker, seasonal_margin: float, resolve_z: float) -> None:
        self._t, self._margin, self._resolve_z = tracker, seasonal_margin, resolve_z
        # How far this epoch's points so far sit from the previous epoch's at the same phases.
        self._epoch: int | None = None
        self._offsets: list[float] = []

    def excuses(self, y: float, epoch: float | None) -> bool:
        """True when the previous epoch was this high at the same phase."""
        if epoch is None:
            return False
        ref = self._t.seasonal.reference(epoch)
        if ref is None:
            return False
        return y <= ref + self._offset(epoch) + self._margin + self._resolve_z * self._t.sigma

    def note(self, y: float, epoch: float) -> None:
        """Note how far an accepted point of this epoch lies from the previous epoch's at its phase."""
        whole = math.floor(epoch)
        if whole != self._epoch:
            self._epoch, self._offsets = whole, []
        ref = self._t.seasonal.reference(epoch)
        if ref is not None:
            self._offsets.append(y - ref)

    def _offset(self, epoch: float) -> float:
        """How much lower than the previous epoch this one runs, at the phases seen so far (<= 0).

        A sawtooth repeats the previous epoch's shape, a little lower for what was learned: its
        points track the previous epoch's. A run that learned fast in its first epoch sits far
        below it at every phase, and the previous epoch's level unlowered would excuse any spike
        up to it (a 2.6x one-point spike five points into epoch 2 of a run falling 10.2 -> 2.3
        was explained away as seasonal). The epoch's first point has nothing to go by: 0.
        """
        if math.floor(epoch) != self._epoch or not self._offsets:
            return 0.0
        ordered = sorted(self._offsets)
        return min(0.0, ordered[len(ordered) // 2])


class RecoveredTail:
    """The one-point excursions (log jump above the level) the run came back from at once: its tail.

    A per-step loss has a tail of its own: a pretraining run reading a mix of sources
    meets a batch of code, a table or another language every few hundred steps, 1.3-1.6x
    its neighbours and gone at the next step, the same batches again each time the data
    order repeats. The first such points of their size are news (spikes). Once the run
    has come straight back from two of them, one no higher than the second largest is
    the run's own tail: it is held for the point after it to judge, as a small jump is.
    Back down, it was one batch; still up, the weights moved and it is a spike from the
    held point, one point late. Two, not one: the largest of a sample is the value one
    fluke sets, and a single spike that recovered may have been trouble itself (a smooth
    run with a few real spikes of similar size has each of them raised until two have
    passed). Only excursions judged against a full level window enter: the first points
    of a run or a warm-up teach nothing about its tail.
    """

    __slots__ = ("_top",)

    def __init__(self) -> None:
        self._top: list[float] = []  # the two largest, largest first

    def note(self, jump: float) -> None:
        """A point ``jump`` above the level, and the point after it back down."""
        top = self._top
        top.append(jump)
        top.sort(reverse=True)
        del top[2:]

    def covers(self, jump: float, slack: float) -> bool:
        """No higher than the second largest such excursion, within ``slack`` (the point's own noise)."""
        return len(self._top) == 2 and jump <= self._top[1] + slack


_TAIL_Z = 4.0  # the lower level (noise units) whose exceedances sample the run's tail
_TAIL_MIN = 30  # exceedances before their mean excess is trusted to extrapolate
_SPIKE_CHANCE = 0.01  # a jump noise of this run gives this often over the points so far is chance


class SpikeChance:
    """How high one point must jump for noise of this run not to give it by chance over its length.

    A fixed ``spike_z`` judges every point alike, so its false alarms grow with the log: a
    per-step run with fat tails (one point in ten twice as wide) meets an 8-sigma point
    about once in a million. The run's own tail says how often: the points that
    exceeded a lower level (``_TAIL_Z`` noise units, and the smallest jump) are a sample of
    it, and above that level a tail falls off no slower than exponentially (peaks over a
    threshold), at the mean excess of that sample. With k such points so far, a jump of
    ``level + mean excess x ln(k / _SPIKE_CHANCE)`` is one noise would give once in a
    hundred runs of this length: the one-point threshold is at least that. The correction
    vanishes while k is small (under ``_TAIL_MIN`` it is not even estimated; at 30 with a
    Gaussian-like tail it is about 7 sigma, the fixed threshold): a short run is judged as
    before. The exponential tail is the conservative reading of a Gaussian one, and a real
    spike of a noisy run is tens of its noise units up, far past it. Points raised as spikes
    do not enter: the sample is the run's noise, not its trouble.
    """

    __slots__ = ("excess", "k")

    def __init__(self) -> None:
        self.k = 0  # exceedances of the lower level so far
        self.excess = 0.0  # their summed excess over it, in noise units

    @staticmethod
    def lower(unit: float, min_jump: float) -> float:
        """The lower level (log) for a point whose noise unit is ``unit``."""
        return max(_TAIL_Z * unit, min_jump)

    def threshold(self, unit: float, min_jump: float) -> float:
        """The jump (log) that noise of this run gives by chance over its points so far (0 while unknown)."""
        if self.k < _TAIL_MIN:
            return 0.0
        beta = self.excess / self.k
        return self.lower(unit, min_jump) + unit * beta * math.log(self.k / _SPIKE_CHANCE)

    def note(self, jump: float, unit: float, min_jump: float) -> None:
        """A point judged against a full level window and not raised: part of the run's tail."""
        low = self.lower(unit, min_jump)
        if jump > low and unit > 0.0:
            self.k += 1
            self.excess += (jump - low) / unit
