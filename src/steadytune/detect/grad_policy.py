"""A gradient-norm bump that the policy's own signals confirm (``grad_spike`` of an RL run).

A bump of a few points, each 2-5x the norm's level, is too small for the one-point rule in
a run whose norm wanders, and a rule that reads only the norm's doublings cannot keep a long
healthy run quiet: a run that doubles one batch in a hundred ends a window of eight with
three doublings about once in a hundred thousand points (docs/detection-benchmark.md).

An RL run logs what a large update does to the policy. The KL to the reference is a property
of the policy, not of the batch it is estimated on: it drifts slowly as the policy learns,
so a KL that rises well above its level on several *different* rollout batches in a row says
the policy itself moved. The token entropy is the same kind of witness: it measures how sure
the policy is, and an update that throws the policy off moves it, up (less sure) or down
(collapsing onto a few tokens). A bump in the norm at the same points, point after point, is
then the cause seen from the optimizer's side: the updates were large and they moved the
policy. Alone, each of these series has healthy excursions; the norm up at points in a row
and the policy moved with it at ``_POINTS`` of them is one event seen from both sides, not
coincidences.

What counts as moved is judged on each series' own noise (a level of 8, the noise of its
successive differences one standard error up, as every series here), at ``_Z`` sigmas and
at least a plain ratio: the norm ``_GRAD_RATIO`` (a doubling), a policy signal
``_POLICY_RATIO``. The KL's first points climb from 0 by design (the policy starts as its
reference), so nothing is judged before ``2 x level_window`` points of it. During a bump every
series is measured from where it stood when the bump began and no point joins a level (the
bump's own points would raise the bar for the next); a policy signal that stays moved for a
whole level window has a new level, and a norm up for two level windows is no bump.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from steadytune.detect.objective import ENTROPY_KEYS, KL_KEYS
from steadytune.detect.stats import Tracker
from steadytune.objectives import first

_Z = 3.0  # noise sigmas (one standard error up) a point must move to count as moved
_GRAD_RATIO = 2.0  # ...and at least this many times the norm's level
_POLICY_RATIO = 1.5  # ...or a policy signal's, either way for the entropy
_POINTS = 3  # points of one bump at which the policy moved too


@dataclass(frozen=True, slots=True)
class Moved:
    """A policy signal that moved at this point: its name, value, level and the ratio of the two."""

    key: str
    value: float
    level: float
    ratio: float


class _Signal:
    """One policy signal's level and noise, and whether a point moved off it."""

    __slots__ = ("both_ways", "held", "ref", "t")

    def __init__(self, level_window: int, noise_window: int, both_ways: bool) -> None:
        self.t = Tracker(level_window, noise_window, 0.5, 2.0, 0.01)
        self.both_ways = both_ways
        self.held = 0  # points in a row kept out of the level
        self.ref: tuple[float, float] | None = None  # (level, the move it takes), log

    def judge(self, step: int, key: str, value: float, gap_factor: float, bump: bool) -> Moved | None:
        """Whether ``value`` moved off the level; ``bump``: the norm is in a bump at this point.

        During a bump every point is measured from where the signal stood when the bump began, and
        none joins the level: the bump's own points would otherwise raise the bar for the next.
        """
        t = self.t
        if t.begin(step, gap_factor):
            self.held, self.ref = 0, None
        # The first 2 level windows of a KL climb from 0 by design: no yardstick yet.
        if (self.ref is None or not bump) and t.n_accepted >= 2 * t.level_window:
            self.ref = (t.level, max(math.log(_POLICY_RATIO), t.threshold(_Z)))
        y = math.log(value)
        moved = None
        if self.ref is not None:
            level, need = self.ref
            jump = abs(y - level) if self.both_ways else y - level
            if jump > need:
                moved = Moved(key, value, math.exp(level), math.exp(y - level))
        if (moved is None and not bump) or self.held >= t.level_window:
            # A signal that stays moved for a whole level window has a new level.
            self.held = 0
            t.accept(y)
        else:
            self.held += 1
        return moved


class PolicyBump:
    """A bump of the norm, and the points of it at which the policy's KL or entropy moved too."""

    __slots__ = ("_entropy", "_gap", "_kl", "_longest", "run")

    def __init__(self, level_window: int, noise_window: int, gap_factor: float) -> None:
        self._kl = _Signal(level_window, noise_window, both_ways=False)
        self._entropy = _Signal(level_window, noise_window, both_ways=True)
        self._gap = gap_factor
        self._longest = 2 * level_window  # a norm up this long has a new level, not a bump
        # The bump so far: (step, norm over its level, the policy signal that moved most or None).
        self.run: list[tuple[int, float, Moved | None]] = []

    def observe(self, step: int, extra: Mapping[str, Any] | None, grad_ratio: float | None) -> bool:
        """Judge one step; ``grad_ratio``: the norm over its level when it moved, else None.

        True once ``_POINTS`` points of the bump (points in a row at which the norm moved) saw
        the policy move too.
        """
        bump = grad_ratio is not None and len(self.run) < self._longest
        moved: list[Moved] = []
        if extra:
            for sig, keys in ((self._kl, KL_KEYS), (self._entropy, ENTROPY_KEYS)):
                found = first(extra, keys)
                if found is not None and found[1] > 0:
                    m = sig.judge(step, found[0], found[1], self._gap, bump)
                    if m is not None:
                        moved.append(m)
        if grad_ratio is None or not bump:
            self.run.clear()
            return False
        top = max(moved, key=lambda m: abs(math.log(m.ratio))) if moved else None
        self.run.append((step, grad_ratio, top))
        return self.confirmed >= _POINTS

    @property
    def confirmed(self) -> int:
        """Points of the bump so far at which the policy moved with the norm."""
        return sum(1 for p in self.run if p[2] is not None)

    @staticmethod
    def grad_jump(threshold: Callable[[float], float]) -> float:
        """How far (log) a norm must lie over its level to have moved: ``threshold(z)`` is its noise's bar."""
        return max(math.log(_GRAD_RATIO), threshold(_Z))
