"""Several gradient norms up in a short stretch (``grad_spike``, ``judged_by: burst``).

A bump that rises over several batches (a hard stretch of data, a warm-up blip, an RL batch of
long completions) may have no point past the one-point threshold of its run (:mod:`grad_tail`):
a fat-tailed run asks 8x of one norm, and a bump of 3-5x over six points is, point by point,
within its tail. Together they are not: ``k`` points in a row, each a ratio ``r`` over the level
they found, happen by chance far more rarely than one.

- **Independence** as the first model: one jump passes ``x`` with a chance ``p(x)`` read from the
  run's own one-point tail (the exponential through its 30 largest jumps, as the one-point rule
  reads it), so ``k`` in a row pass it with ``p(x)^k`` at one place, and about ``n p(x)^k`` times
  over the run's ``n`` points. The ``x`` that noise passes with a chance of 1 % over the run is
  ``low + beta (ln 30 - (1 - 1/k) ln n - (1/k) ln 0.01)``: it falls with ``k``, and grows with the
  run's length as the one-point rule's does. Below ``low`` the exponential says nothing, so that
  is as far as it goes down.
- **Where independence fails**: norms that wander (an RL run's norm follows its batch difficulty
  for several steps, a norm that drifts 3-4x over a long run) put ``k`` jumps in a row over a
  level far more often than ``p^k``. So the same statistic, the smallest of ``k`` jumps in a row
  over the level before the first of them, is also read from the run's own noise: its 30 largest
  values give an exponential tail of the run's own ``k``-point excursions, autocorrelation
  included, and the threshold is the larger of the two readings. Until the run has shown 31 such
  windows nothing is judged (a short run's bumps are the young-run rules' to judge).
- **k of m**: a cluster of blips with ordinary batches between them (a warm-up's 4-8x norms every
  few steps) is the same question for the ``k``-th largest of ``m`` jumps in a row, with ``C(m, k)``
  ways for chance to place them. Seven windows are looked at (:data:`_WINDOWS`), each at a seventh
  of the 1 % (their union stays at 1 %), and never under ``_FLOOR`` (2x): three points each twice
  their level carry the log-evidence of one point at the prior's 8x, and a smaller bump is no
  unusual batch worth a warning, however quiet the run.

The level is the one found before the window's first point, so the bump's first points, taken
into the level meanwhile, do not hide its later ones. A window's statistic joins the run's own tail
only once ``m`` more points have come (a bump's first points would otherwise raise the bar for its
later ones). A raised burst lasts until ``m`` norms in a row are back under ``_FLOOR`` over that
level; its points stay out of the run's tails.
"""

from __future__ import annotations

import math
from collections import deque

from steadytune.detect.grad_tail import GradChance

# (k, m): k of m norms in a row up; k of k is a bump, k of more a cluster of blips.
_WINDOWS = ((3, 3), (4, 4), (6, 6), (8, 8), (3, 6), (4, 10), (5, 16))
_SPAN = max(m for _, m in _WINDOWS)
_CHANCE = 0.01 / len(_WINDOWS)  # each window's share of the run's 1 %
_FLOOR = math.log(2.0)  # never a burst under 2x: three such points are the prior's one 8x point


class GradBurst:
    """The run's recent jumps and its own ``k``-of-``m`` excursions; says when a stretch is a burst."""

    __slots__ = ("_last", "_pending", "_quiet", "_recent", "_tails", "_window", "ref")

    def __init__(self) -> None:
        self._recent: deque[tuple[float, float, int]] = deque(maxlen=_SPAN)  # (log norm, level before, step)
        self._tails = {w: GradChance() for w in _WINDOWS}
        self._pending: deque[list[tuple[tuple[int, int], float]]] = deque()  # statistics not yet noted
        self._last = -2  # index of the last point seen: a point not seen breaks the stretch
        self.ref: float | None = None  # the level a raised burst stands over; None when none is on
        self._window = 0  # m of the raised burst
        self._quiet = 0  # norms in a row back under the floor since

    def see(
        self, index: int, step: int, y: float, level: float, one_point: GradChance
    ) -> tuple[int, int, int, float, float] | None:
        """Judge the ``index``-th norm (log ``y``, the level before it ``level``) the one-point rule passed.

        Returns ``(k, m, first step, k-th largest jump, threshold)`` when ``k`` of the last ``m`` points
        are a burst (:attr:`ref` is then the level before the first of the ``m``), else None. A raised
        burst is over once :meth:`over` says so.
        """
        if index != self._last + 1:
            self._recent.clear()
            self._pending.clear()
        self._last = index
        self._recent.append((y, level, step))
        if self.ref is not None:
            return None
        pts = list(self._recent)
        stats: list[tuple[tuple[int, int], float]] = []
        for k, m in _WINDOWS:
            if len(pts) < m:
                continue
            ref = pts[-m][1]
            ups = sorted((p[0] for p in pts[-m:]), reverse=True)
            jump = ups[k - 1] - ref
            thr = self._threshold(k, m, one_point) if jump > _FLOOR else None  # most points: not near
            if thr is not None and jump > thr:
                self.ref, self._window, self._quiet = ref, m, 0
                self._pending.clear()  # the stretch's points: not the run's noise
                first = next(p[2] for p in pts[-m:] if p[0] - ref > thr)
                return k, m, first, jump, thr
            stats.append(((k, m), jump))
        # Not raised: the run's own excursions, autocorrelation and all, noted once _SPAN points follow.
        self._pending.append(stats)
        if len(self._pending) > _SPAN:
            for w, jump in self._pending.popleft():
                self._tails[w].note(jump)
        return None

    def over(self, y: float | None) -> bool:
        """Whether a raised burst ends at this norm (log ``y``; None: not a positive norm)."""
        if self.ref is None:
            return False
        self._quiet = 0 if y is not None and y - self.ref > _FLOOR else self._quiet + 1
        if self._quiet < self._window:
            return False
        self.ref = None
        self._recent.clear()
        return True

    def _threshold(self, k: int, m: int, one_point: GradChance) -> float | None:
        """The jump ``k`` of ``m`` points must clear; None while the run's tails are unknown."""
        own = self._tails[(k, m)].chance_jump(_CHANCE)
        indep = one_point.run_jump(k, _CHANCE / math.comb(m, k))
        if own is None or indep is None:
            return None
        return max(own, indep, _FLOOR)
