"""Incremental robust statistics of one noisy metric.

Detectors see one value at a time and must cost well under a millisecond, so
nothing here looks back over the whole history: a metric is summarised by

- a *level*: the median of the last few accepted points (robust to outliers,
  quick to follow a falling loss);
- a *noise* scale: the median absolute successive difference over a longer
  window. Differences cancel the trend and the epoch staircase, so a falling or
  stepped curve does not look noisy; the median ignores the spikes themselves;
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

_MAD_TO_SIGMA = 1.0 / (0.6745 * math.sqrt(2.0))  # median |N(0, 2σ²)| = 0.6745·√2·σ
_EPOCH_BUCKETS = 20


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

    def clear(self) -> None:
        self._fifo.clear()
        self._sorted.clear()

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


def to_log(x: float) -> float:
    """Log space for positive metrics; zero maps far down instead of to -inf."""
    return math.log(x) if x > 1e-12 else -27.6


class Seasonal:
    """Mean level per phase bucket of the current and the previous epoch."""

    __slots__ = ("_cur", "_epoch", "_prev")

    def __init__(self) -> None:
        self._epoch: int | None = None
        self._cur: list[list[float]] = [[0.0, 0.0] for _ in range(_EPOCH_BUCKETS)]
        self._prev: list[list[float]] | None = None

    def _bucket(self, epoch: float) -> int:
        return min(_EPOCH_BUCKETS - 1, int((epoch - math.floor(epoch)) * _EPOCH_BUCKETS))

    def add(self, epoch: float, y: float) -> None:
        whole = math.floor(epoch)
        if self._epoch is None or whole != self._epoch:
            self._prev = self._cur if self._epoch is not None and whole == self._epoch + 1 else None
            self._cur = [[0.0, 0.0] for _ in range(_EPOCH_BUCKETS)]
            self._epoch = whole
        cell = self._cur[self._bucket(epoch)]
        cell[0] += y
        cell[1] += 1

    def reference(self, epoch: float) -> float | None:
        """The highest mean level of the previous epoch near this phase, if any."""
        if self._prev is None or self._epoch is None or math.floor(epoch) != self._epoch:
            return None
        b = self._bucket(epoch)
        best: float | None = None
        for i in (b - 1, b, b + 1):
            if 0 <= i < _EPOCH_BUCKETS and self._prev[i][1]:
                mean = self._prev[i][0] / self._prev[i][1]
                best = mean if best is None else max(best, mean)
        return best


class Tracker:
    """Level, noise, segments and seasonality of one metric, updated one point at a time.

    Call :meth:`begin` with each new step first (it detects gaps), judge the new
    value against :attr:`level` and :meth:`threshold`, then :meth:`accept` it if
    it is ordinary. Values are in log space when ``log`` is set.
    """

    __slots__ = (
        "_intervals",
        "_last_y",
        "_levels",
        "_noise",
        "_recent_noise",
        "best_level",
        "floor",
        "last_step",
        "log",
        "n_accepted",
        "prior_var",
        "prior_weight",
        "seasonal",
        "segment_start",
    )

    def __init__(
        self,
        level_window: int,
        noise_window: int,
        prior: float,
        prior_weight: float,
        floor: float,
        log: bool = True,
    ) -> None:
        self.log = log
        self.prior_var = prior * prior
        self.prior_weight = prior_weight
        self.floor = floor
        self._levels = SortedWindow(level_window)
        self._noise = SortedWindow(noise_window)
        self._recent_noise = SortedWindow(16)
        self._intervals = SortedWindow(16)
        self._last_y: float | None = None
        self.last_step: int | None = None
        self.segment_start: int | None = None
        self.best_level: float | None = None
        self.n_accepted = 0
        self.seasonal = Seasonal()

    def y(self, x: float) -> float:
        return to_log(x) if self.log else x

    def begin(self, step: int, gap_factor: float) -> bool:
        """Note a new step; True when it opens a new segment (gap or restart), which resets the level."""
        last = self.last_step
        self.last_step = step
        if last is None:
            self.segment_start = step
            return True
        interval = step - last
        # The lower quartile of recent intervals is the logging interval even when
        # the log is a collection of snippets with huge gaps between them.
        typical = self._intervals.quantile(0.25) if len(self._intervals) else interval
        self._intervals.push(float(interval))
        if interval <= 0 or (len(self._intervals) > 1 and interval > gap_factor * max(typical, 1.0)):
            self._levels.clear()
            self._last_y = None
            self.best_level = None
            self.segment_start = step
            return True
        return False

    @property
    def n_level(self) -> int:
        return len(self._levels)

    @property
    def level_full(self) -> bool:
        return len(self._levels) == self._levels.size

    @property
    def level(self) -> float:
        return self._levels.median()

    @property
    def last_y(self) -> float | None:
        return self._last_y

    @property
    def sigma(self) -> float:
        """Noise per point, shrunk towards the prior while few differences are known.

        The larger of the long and the recent estimate: noise that grows (a DPO
        loss leaving ln 2, a loss nearing zero in log space) is believed at once,
        while noise that shrinks is believed only slowly.
        """
        n = len(self._noise)
        if n:
            s = self._noise.median()
            if len(self._recent_noise) >= 8:
                s = max(s, self._recent_noise.median())
            s *= _MAD_TO_SIGMA
            var = (self.prior_weight * self.prior_var + n * s * s) / (self.prior_weight + n)
        else:
            var = self.prior_var
        return max(math.sqrt(var), self.floor)

    def threshold(self, z: float) -> float:
        """How far above the level a point must lie to be z sigmas out (prediction interval)."""
        return z * self.sigma * math.sqrt(1.0 + 1.0 / max(1, self.n_level))

    def accept(self, y: float, epoch: float | None = None) -> None:
        if self._last_y is not None:
            d = abs(y - self._last_y)
            self._noise.push(d)
            self._recent_noise.push(d)
        self._last_y = y
        self._levels.push(y)
        self.n_accepted += 1
        if len(self._levels) == self._levels.size:
            lvl = self._levels.median()
            if self.best_level is None or lvl < self.best_level:
                self.best_level = lvl
        if epoch is not None:
            self.seasonal.add(epoch, y)

    def recent(self) -> deque[float]:
        return self._levels.values
