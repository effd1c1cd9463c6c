"""Incremental robust statistics of one noisy metric.

Detectors see one value at a time and must cost well under a millisecond, so
nothing here looks back over the whole history: a metric is summarised by

- a *level*: the median of the last few accepted points (robust to outliers,
  quick to follow a falling loss);
- a *noise* scale: the median absolute successive difference over a longer
  window, each difference taken from the local median difference (the local
  trend). Differences cancel the level and the epoch staircase, and the local
  median difference cancels the slope, so a steeply falling curve (a warm-up)
  does not look noisy either; the medians ignore the spikes themselves;
- *segments*: a step gap many times the usual logging interval (snippets of a
  log, a resumed run) makes the old level stale, so the level starts again;
- a *seasonal* memory: the level at each phase of the previous epoch, so the
  jump back up at an epoch boundary of a multi-epoch run is recognised.

Before enough differences are seen, the noise is shrunk towards a prior (a
weighted mean of variances), so two lucky identical points cannot make the
next ordinary one look like a 50-sigma event.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from dataclasses import dataclass

_MAD_TO_SIGMA = 1.0 / (0.6745 * math.sqrt(2.0))  # median |N(0, 2σ²)| = 0.6745·√2·σ
_Q90_TO_SIGMA = 1.0 / (1.6449 * math.sqrt(2.0))  # 90th percentile of |N(0, 2σ²)|
_MEAN_ABS_TO_SIGMA = 1.0 / (2.0 / math.sqrt(math.pi))  # mean |N(0, 2σ²)| = 2σ/√π
_EPOCH_BUCKETS = 20
# The local trend is the median of this many preceding differences: few enough that the slope of a
# steep start changes little across them (an exponential fall with a time constant of 20 points
# changes its slope by a fifth over four points), enough that their median is steady.
_TREND_DIFFS = 8
# A difference less the median of _TREND_DIFFS others is wider than the difference alone (the median
# has its own error): 1.097x at every quantile, measured on 400,000 Gaussian differences. Divided out,
# so a series without a trend keeps the noise it had.
_TREND_WIDENING = 1.097


class SortedWindow:
    """The last ``size`` values in arrival order and in sorted order."""

    __slots__ = ("_fifo", "_sorted", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._fifo: deque[float] = deque()
        self._sorted: list[float] = []

    def push(self, x: float) -> None:
        if len(self._fifo) == self.size:
            old = self._fifo.popleft()
            del self._sorted[bisect_left(self._sorted, old)]
        self._fifo.append(x)
        insort(self._sorted, x)

    def __len__(self) -> int:
        return len(self._fifo)

    @property
    def values(self) -> deque[float]:
        return self._fifo

    def median(self) -> float:
        s = self._sorted
        n = len(s)
        mid = n // 2
        return s[mid] if n % 2 else 0.5 * (s[mid - 1] + s[mid])

    def quantile(self, q: float) -> float:
        s = self._sorted
        return s[min(len(s) - 1, int(q * len(s)))]


class Seasonal:
    """Mean level per phase bucket of the current and the previous epoch.

    Only the first ``fresh`` points of an epoch may be explained by the previous
    one: that is how long the recent level still holds the end of the last epoch.
    Later in an epoch a point is judged against the level alone, so a spike in a
    run whose earlier epochs were higher is still a spike.
    """

    __slots__ = ("_cur", "_epoch", "_n_cur", "_prev", "fresh")

    def __init__(self, fresh: int = 8) -> None:
        self.fresh = fresh
        self._epoch: int | None = None
        self._n_cur = 0
        self._cur: list[list[float]] = [[0.0, 0.0] for _ in range(_EPOCH_BUCKETS)]
        self._prev: list[list[float]] | None = None

    def _bucket(self, epoch: float) -> int:
        return min(_EPOCH_BUCKETS - 1, int((epoch - math.floor(epoch)) * _EPOCH_BUCKETS))

    def add(self, epoch: float, y: float) -> None:
        whole = int(epoch) if epoch >= 0 else math.floor(epoch)
        if whole != self._epoch:
            self._prev = self._cur if self._epoch is not None and whole == self._epoch + 1 else None
            self._cur = [[0.0, 0.0] for _ in range(_EPOCH_BUCKETS)]
            self._epoch = whole
            self._n_cur = 0
        self._n_cur += 1
        cell = self._cur[min(_EPOCH_BUCKETS - 1, int((epoch - whole) * _EPOCH_BUCKETS))]
        cell[0] += y
        cell[1] += 1

    def reference(self, epoch: float) -> float | None:
        """The highest mean level of the previous epoch near this phase, early in an epoch only.

        The point being judged may be the first of a new epoch (not added yet): then
        the epoch in progress is the previous one.
        """
        if self._epoch is None:
            return None
        whole = math.floor(epoch)
        if whole == self._epoch:
            prev = self._prev if self._n_cur < self.fresh else None
        else:
            prev = self._cur if whole == self._epoch + 1 else None
        if prev is None:
            return None
        b = self._bucket(epoch)
        best: float | None = None
        for i in (b - 1, b, b + 1):
            if 0 <= i < _EPOCH_BUCKETS and prev[i][1]:
                mean = prev[i][0] / prev[i][1]
                best = mean if best is None else max(best, mean)
        return best


def _chi2_upper_factor(k: int) -> float:
    """sqrt(k / chi2_k(0.16)): how much a noise estimate from k differences may understate sigma.

    Wilson-Hilferty's cube-root normal approximation of the chi-square quantile.
    """
    if k <= 0:
        return 1.0
    a = 2.0 / (9.0 * k)
    q = k * max(1.0 - a - _UPPER_Z * math.sqrt(a), 0.05) ** 3
    return math.sqrt(k / q)


_UPPER_Z = 1.0  # one standard error up: the 84% one-sided bound
_UPPER = tuple(_chi2_upper_factor(k) for k in range(257))


def upper_factor(k: int) -> float:
    """How far (x) to raise a noise estimate from ``k`` differences to its one-standard-error bound."""
    return _UPPER[k] if k < len(_UPPER) else _chi2_upper_factor(k)


def _median(ordered: list[float]) -> float:
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


class Tracker:
    """Level, noise, segments and seasonality of one metric, updated one point at a time.

    Call :meth:`begin` with each new step first (it detects gaps), judge the new
    value against :attr:`level` and :meth:`threshold`, then :meth:`accept` it if
    it is ordinary. Callers pass values in log space. This is the hot
    path of every detector, so windows are plain lists and the level is cached.
    """

    __slots__ = (
        "_gaps",
        "_iv_count",
        "_iv_fifo",
        "_lv_fifo",
        "_lv_history",
        "_lv_size",
        "_lv_sorted",
        "_nz_fifo",
        "_nz_size",
        "_nz_sorted",
        "_recent_abs",
        "_seg_diffs",
        "_seg_recent",
        "_sigma",
        "_slope",
        "_trend_fifo",
        "_trend_sorted",
        "_typical",
        "best_level",
        "floor",
        "last_step",
        "last_y",
        "level",
        "n_accepted",
        "n_level",
        "prior_var",
        "prior_weight",
        "seasonal",
    )

    def __init__(
        self,
        level_window: int,
        noise_window: int,
        prior: float,
        prior_weight: float,
        floor: float,
    ) -> None:
        self.prior_var = prior * prior
        self.prior_weight = prior_weight
        self.floor = floor
        self._lv_fifo: deque[float] = deque()
        self._lv_sorted: list[float] = []
        self._lv_size = level_window
        # The full levels of the last level_window + 1 accepted points: the first and the last are
        # medians of disjoint windows, whose difference is the fall over one window.
        self._lv_history: deque[float] = deque(maxlen=level_window + 1)
        self._nz_fifo: deque[float] = deque()
        self._nz_sorted: list[float] = []
        self._nz_size = noise_window
        self._recent_abs = 0.0  # running mean of |Δ| over about the last 8 points
        self._seg_diffs = 0  # differences this segment added to the noise window
        self._seg_recent = 0.0  # the running mean of |Δ| when the segment began
        # The last signed differences, in arrival order and sorted: their median is the local trend.
        self._trend_fifo: deque[float] = deque()
        self._trend_sorted: list[float] = []
        self._iv_fifo: deque[int] = deque(maxlen=16)
        self._iv_count = 0
        self._gaps: deque[int] = deque(maxlen=3)
        self._typical: int | None = None
        self._sigma: float | None = None
        # falling_slope() until the trend, the level or the best level next change: it is read
        # twice a point (the jump's fall ahead, then the difference the point adds).
        self._slope: float | None = None
        self.level = 0.0
        self.n_level = 0
        self.last_y: float | None = None
        self.last_step: int | None = None
        self.best_level: float | None = None
        self.n_accepted = 0
        self.seasonal = Seasonal(level_window)

    def begin(self, step: int, gap_factor: float) -> bool:
        """Note a new step; True when it opens a new segment (gap or restart), which resets the level."""
        last = self.last_step
        self.last_step = step
        if last is None:
            self._seg_diffs, self._seg_recent = 0, self._recent_abs
            return True
        interval = step - last
        typical = self._typical
        gap = interval <= 0 or (typical is not None and interval > gap_factor * max(typical, 1))
        # The logging interval is the median of recent intervals that were not gaps, so a log
        # made of snippets keeps its real interval. Three similar gaps in a row are a new
        # interval (logging became sparser), not gaps. Sorted only every few points.
        if gap and interval > 0:
            self._gaps.append(interval)
            similar = len(self._gaps) >= 3 and max(self._gaps) <= 2 * min(self._gaps)
            if similar:
                self._iv_fifo.extend(self._gaps)
                self._typical = sorted(self._iv_fifo)[len(self._iv_fifo) // 2]
        elif not gap:
            if self._gaps:
                self._gaps.clear()
            self._iv_fifo.append(interval)
            self._iv_count += 1
            if self._iv_count < 16 or self._iv_count % 8 == 0:
                self._typical = sorted(self._iv_fifo)[len(self._iv_fifo) // 2]
        if gap:
            self._lv_fifo.clear()
            self._lv_history.clear()
            self._lv_sorted.clear()
            self.n_level = 0
            self.last_y = None
            self.best_level = None
            self._slope = None
            self._seg_diffs, self._seg_recent = 0, self._recent_abs
            return True
        return False

    def restart_segment(self, y: float) -> None:
        """Take back every point of this segment after its first (``y``): they were not ordinary.

        A climb from a segment's first point is recognised only after several rises, once
        its points are in the level and its increments in the noise; left there, they would
        make the diverged loss the baseline and the climb look like noise. The noise keeps
        what came before the segment (a difference pushed out of a full window is not
        brought back: at most a few of 64).
        """
        fifo, ordered = self._nz_fifo, self._nz_sorted
        for _ in range(min(self._seg_diffs, len(fifo))):
            del ordered[bisect_left(ordered, fifo.pop())]
        self._seg_diffs = 0
        self._recent_abs = self._seg_recent
        self._trend_fifo.clear()  # the climb's slope is no trend to take out of what follows
        self._trend_sorted.clear()
        self._lv_fifo.clear()
        self._lv_history.clear()
        self._lv_sorted.clear()
        self._lv_fifo.append(y)
        self._lv_sorted.append(y)
        self.level, self.n_level, self.last_y = y, 1, y
        self.best_level = None
        self._sigma = self._slope = None

    def _detrended(self, diff: float) -> float:
        """How far a successive difference lies from the local trend, in the units of ``|diff|``.

        During a steep fall every difference carries the slope: a loss falling 3 % a point
        with 0.5 % noise has a median |difference| of 3 %, and a 1.5x spike would be judged
        against six times its real noise. The median of the preceding differences is the
        local slope (robust to a spike or an epoch step among them); taking it out leaves
        the noise. Only a measured fall is taken out (:meth:`falling_slope`): a climb's
        differences stay noise, so a diverging loss is not made to look quiet (its level lags
        behind it, and each point would look a spike), and a flat series keeps the estimate
        it had, without the extra spread a noisy median would add to it.
        """
        fifo, ordered = self._trend_fifo, self._trend_sorted
        n = len(ordered)
        slope = self._slope
        if slope is None:
            slope = self._slope = self._falling_slope()
        dev = abs(diff - slope) / _TREND_WIDENING if slope < 0.0 else abs(diff)
        if n == _TREND_DIFFS:
            del ordered[bisect_left(ordered, fifo.popleft())]
        fifo.append(diff)
        insort(ordered, diff)
        return dev

    def falling_slope(self) -> float:
        """The local slope (log per point) where the series clearly falls; 0.0 elsewhere.

        The median of the last ``_TREND_DIFFS`` differences, counted only when it is more than
        two of its standard errors below zero (the spread of those differences, from their
        quartiles, over the root of their number): a fall measured, not a flat series' noise.
        Until that many differences are known, 0.0: the median of a few is too unsteady a slope.
        And only while the level makes new lows (it is the best level): a fall back from a bump
        is the bump ending, not learning, and in a smoothed (EMA) loss it is the smoothing's own
        decay, whose differences are no noise to take a slope out of.
        """
        slope = self._slope
        if slope is None:
            slope = self._slope = self._falling_slope()
        return slope

    def _falling_slope(self) -> float:
        ordered = self._trend_sorted
        k = len(ordered)
        if k < _TREND_DIFFS or self.best_level is None or self.level > self.best_level:
            return 0.0
        slope = _median(ordered)
        spread = (ordered[(3 * k) // 4 - 1] - ordered[k // 4]) / 1.349  # IQR of a normal: 1.349 sigma
        return slope if slope < -2.0 * 1.2533 * spread / math.sqrt(k) else 0.0  # SE of a median: 1.2533 s/√k

    @property
    def fall_ahead(self) -> float:
        """How far (log, <= 0) a falling series has moved on from its level by the next point.

        The level is the median of the last ``level_window`` accepted points: in a steady fall
        it is where the series was (level_window + 1) / 2 points before the next one. A point
        judged against it during a steep fall has that fall taken off its jump, so a 1.4x
        spike in a warm-up reads as 1.2x. The fall is the level's drop over the last window
        (two disjoint medians: a slope steady enough to carry forward, unlike the median of a
        few differences), counted only when it is more than twice the noise, so noise never
        lowers the baseline; and only a fall: a rising series is trouble in itself, and must
        not raise the baseline a jump is judged from. The median of the last differences must
        show the fall as well, and the gentler of the two rates is taken: an epoch staircase's
        one step down drops the level as much, but is one difference, not a slope.
        """
        hist = self._lv_history
        if len(hist) <= self._lv_size:
            return 0.0
        slope = self._slope
        if slope is None:
            slope = self._slope = self._falling_slope()
        if slope >= 0.0:
            return 0.0
        drop = hist[-1] - hist[0]
        if drop >= -2.0 * self.sigma:
            return 0.0
        return min(max(drop / self._lv_size, slope), 0.0) * 0.5 * (self._lv_size + 1)

    @property
    def level_full(self) -> bool:
        return self.n_level == self._lv_size

    @property
    def level_window(self) -> int:
        return self._lv_size

    @property
    def n_noise(self) -> int:
        """Differences the noise is measured from (kept across gaps: a gap moves the level, not the noise)."""
        return len(self._nz_fifo)

    @property
    def sigma(self) -> float:
        """Noise per point, shrunk towards the prior while few differences are known.

        The largest of three estimates: the median successive difference over
        the long window, its upper decile (fat tails: per-sample losses, DPO),
        and the mean over about the last 8 points (noise that grows, as a loss
        leaving ln 2 or nearing zero in log space, is believed at once; noise
        that shrinks only slowly). Spikes never enter: only accepted points do.
        """
        if self._sigma is None:
            self._sigma = self._estimate_sigma()
        return self._sigma

    def _estimate_sigma(self) -> float:
        ordered = self._nz_sorted
        n = len(ordered)
        if not n:
            return max(math.sqrt(self.prior_var), self.floor)
        s = _median(ordered) * _MAD_TO_SIGMA
        if n >= 16:
            s = max(s, ordered[int(0.9 * n)] * _Q90_TO_SIGMA)
        if n >= 8:
            # Believed only when clearly larger: the max of noisy estimates drifts upward.
            recent = self._recent_abs * _MEAN_ABS_TO_SIGMA
            if recent > 1.5 * s:
                s = recent
        # Shrink in log space: a scale's natural average is geometric. A weighted mean of
        # variances lets a prior worth one difference hold a quiet series (pretraining
        # losses, sigma 0.007) at three times its measured noise after 64 differences.
        s = max(s, self.floor)
        w = self.prior_weight
        log_var = (w * math.log(self.prior_var) + n * 2.0 * math.log(s)) / (w + n)
        return max(math.exp(0.5 * log_var), self.floor)

    @property
    def sigma_upper(self) -> float:
        """The noise, one standard error up: an estimate from few differences may understate it.

        Thresholds use this, so a lucky quiet start cannot make ordinary noise a spike; with
        a full noise window it is within 10% of :attr:`sigma`.
        """
        return self.sigma * upper_factor(len(self._nz_fifo))

    def threshold(self, z: float) -> float:
        """How far above the level a point must lie to be z sigmas out (prediction interval)."""
        return z * self.sigma_upper * math.sqrt(1.0 + 1.0 / max(1, self.n_level))

    def accept(self, y: float, epoch: float | None = None) -> None:
        # The two window updates are written out in full: this runs for every point of every metric.
        self._sigma = None
        last = self.last_y
        if last is not None:
            d = self._detrended(y - last)
            fifo, ordered = self._nz_fifo, self._nz_sorted
            if len(fifo) == self._nz_size:
                del ordered[bisect_left(ordered, fifo.popleft())]
            fifo.append(d)
            insort(ordered, d)
            self._seg_diffs += 1
            n_noise = len(ordered)
            self._recent_abs += (d - self._recent_abs) * (0.125 if n_noise >= 8 else 1.0 / n_noise)
        self.last_y = y
        self._slope = None  # read above, before the difference joined the trend; the level moves below
        fifo, ordered = self._lv_fifo, self._lv_sorted
        if len(fifo) == self._lv_size:
            del ordered[bisect_left(ordered, fifo.popleft())]
        fifo.append(y)
        insort(ordered, y)
        n = len(ordered)
        mid = n // 2
        self.level = lvl = ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])
        self.n_level = n
        self.n_accepted += 1
        if n == self._lv_size:
            self._lv_history.append(lvl)
            if self.best_level is None or lvl < self.best_level:
                self.best_level = lvl
        if epoch is not None:
            self.seasonal.add(epoch, y)


@dataclass(frozen=True, slots=True)
class SeriesLimits:
    """How one noisy series is summarised, and how far a point must jump to stand out.

    The set-up the loss and gradient-norm series share: the windows and gap rule of
    ``detect.series``, and the noise prior and spike thresholds their own section
    (``detect.loss`` or ``detect.grad``) gives under the same names.
    """

    level_window: int
    noise_window: int
    gap_factor: float
    noise_prior: float
    noise_prior_weight: float
    noise_floor: float
    spike_z: float
    spike_min_ratio: float

    def tracker(self) -> Tracker:
        """A fresh level-and-noise tracker for one such series."""
        return Tracker(
            self.level_window, self.noise_window, self.noise_prior, self.noise_prior_weight, self.noise_floor
        )
