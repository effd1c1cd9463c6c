"""reward_collapse: the reward of an RL or preference run falls and stays down.

A policy that collapses (into gibberish, into silence, into one answer it repeats)
takes its reward down with it within a few steps, to a floor it then holds: often
exactly the reward function's lowest value, since every completion scores alike. A
healthy reward is noisy and may dip, but it does not fall far below its best and stay
there. So the reward is compared with the best level it has held (the median of the
last ``series.level_window`` points, 8), not with its recent level, which a slow slide
would drag along:

- a point is **low** once it lies one noise sigma below that best (the noise of the
  reward per point, see :class:`_Noise`); low points in a row are held out of the
  level and the noise, and come back into them when the run of them breaks;
- ``rl.collapse_points`` (3) or more low points in a row are a **collapse** when their
  mean lies below the best by ``rl.collapse_z`` (4) standard errors of that difference
  (the mean's, ``σ/√m``, and the best level's own, ``1.25σ/√n`` for a median of n),
  plus two of the best's standard errors for having been picked as the highest of many
  levels; and, when the reward had gained since its first level, by ``rl.collapse_share``
  (half) of what it gained: a run that learned a lot may lose a few sigmas of it to
  drift, not half. A fall of a few sigmas is a collapse once it has lasted long enough
  to be more than noise; a fall of many is one after three points. And not one the run's
  own rewards give by chance: when the share of its last ``series.noise_window`` (64)
  accepted rewards at or below the highest of the low points, raised to their number,
  is ``CHANCE`` (1e-4) or more, it waits for more of them. A coarse reward (the mean of
  a few binary scores) that has been 0 on half its batches drops to 0 three times
  running one time in eight, and its noise, measured while it rose from nothing,
  understates the next spread; a policy collapsed to a floor it was rarely at does not
  wait. Nor while most of the recent rewards (the same 64, the low points among them)
  sit exactly at one value above the low points: a policy pinned at one answer strays
  below it now and then and comes back to it (``no_learning_signal`` tells that run); a
  collapse from there is told once the value has lost its majority. Dated at the low point
  from which on the points lie most significantly below the best (their deficit times the
  square root of their number; the earliest on a tie): a dip of a sigma just before a fall
  is not its start, the first point of an even slide is;
- while the level is **young** (fewer than ``series.level_window`` rewards accepted: a
  short run, or a fall from the first batches), the few accepted differences are wide and
  the fall swells them: a point below every reward accepted is low too, the low points are
  judged on the noise pooled with their own (a floor shows the reward's noise as well),
  from the point where they lie most significantly below the best on (where the collapse
  is dated: a slide of a few batches down to the floor is no noise of the floor, and would
  swell the pooled noise past any fall), and their chance on the rule of succession's
  share, one standard error up (three rewards none of them as low still leave a floor the
  run may sit at a third of the time);
- it lasts while the points stay low, and clears after as many in a row that are not;
- a DPO run's margins (``rewards/margins``, ``rewards/chosen``) start at exactly 0, where
  the policy is its reference: a fall there is a collapse only from a best that lay above
  that start by as much as the fall must be deep. Margins that never rose and go below 0
  are a policy learning the wrong way (chosen and rejected swapped, a sign error), which
  the preference rule tells as ``no_learning_signal`` (:mod:`.preference`): its fix is
  the data or the loss, which a rollback to a checkpoint trained on the same pairs is
  not. One trouble, one episode.

The entropy and the completion length, where logged, say what the policy collapsed
into, against their levels at the reward's best: an entropy run away (3x and more) is
gibberish, one collapsed (a third and less) is a policy repeating a few tokens, a
length shrunk to a third is silence, one tripled is rambling. They are the evidence,
not the trigger: the reward is what the user optimises.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, ClassVar

from steadytune.detect.base import Finding, KindInfo, Reporter, rounded
from steadytune.detect.objective import ENTROPY_KEYS, LENGTH_KEYS
from steadytune.detect.points import Signal
from steadytune.detect.stats import upper_factor
from steadytune.objectives import LOSS_OBJECTIVE, REWARD_KEYS, first

KINDS: dict[str, KindInfo] = {
    "reward_collapse": KindInfo(
        "reward collapsed",
        "the reward fell far below its best and stayed down: the policy collapsed into degenerate "
        "output (a too-high LR, a too-small KL penalty, or a reward it learned to game and lost)",
        "roll back to the last good checkpoint with a lower LR, raise the KL coefficient (beta); look "
        "at completions from before and after the fall",
        "warning",
        after={
            "rollback": "raise the KL coefficient (beta) if it comes back; look at completions from before "
            "and after the fall"
        },
    ),
}

_MEAN_ABS_DIFF_TO_SIGMA = math.sqrt(math.pi) / 2  # mean |N(0, 2σ²)| = 2σ/√π
_MEAN_ABS_DEV_TO_SIGMA = math.sqrt(math.pi / 2)  # mean |N(0, σ²)| = σ√(2/π)
_MEDIAN_SE = 1.2533  # a median's standard error over a mean's, for normal noise
_RUNAWAY = 3.0  # the entropy or length moved this many times its level at the reward's best
_LEVEL = 8  # points in the entropy's and the length's own levels
_YOUNG = 3  # accepted points before the level is a best to fall from
# Fields that are exactly 0 at a run's first step (a DPO policy is its reference there): a best must
# rise above that start before a fall from it is a collapse (module docstring).
_START_AT_ZERO = frozenset({"rewards/margins", "rewards/chosen"})
# A stretch the run's own rate gives this often or more is chance, not trouble (learning.py uses it too).
CHANCE = 1e-4


@dataclass(frozen=True, slots=True)
class RewardLimits:
    """As ``detect.series`` and ``detect.rl`` name them (docs/detectors.md)."""

    level_window: int
    noise_window: int
    collapse_z: float
    collapse_share: float
    collapse_points: int


class _Level:
    """The median of a field's last few values."""

    def __init__(self, size: int = _LEVEL) -> None:
        self.values: deque[float] = deque(maxlen=size)

    def add(self, v: float | None) -> None:
        if v is not None:
            self.values.append(v)

    @property
    def level(self) -> float | None:
        if not self.values:
            return None
        s = sorted(self.values)
        return s[len(s) // 2]


class _Noise:
    """A reward's noise per point: the larger of two means of absolute deviations, over the last
    ``size`` accepted points, one standard error up while few are known.

    Means, not medians: a reward that takes a few values (a binary reward averaged over a small batch)
    repeats itself, and a median of deviations that are mostly 0 would call it noiseless. Successive
    differences cancel a trend; deviations from the level before each point do not stick to a value
    the reward repeats for a while (0.25, 0.25, 0.25, 0, 0.25, ...), which the differences would.
    """

    def __init__(self, size: int) -> None:
        self.diffs: deque[float] = deque(maxlen=size)
        self.devs: deque[float] = deque(maxlen=size)

    def add(self, diff: float, dev: float) -> None:
        self.diffs.append(diff)
        self.devs.append(dev)

    @property
    def sigma(self) -> float:
        if not self.diffs:
            return 0.0
        by_diffs = sum(self.diffs) / len(self.diffs) * _MEAN_ABS_DIFF_TO_SIGMA
        by_devs = sum(self.devs) / len(self.devs) * _MEAN_ABS_DEV_TO_SIGMA
        return max(by_diffs, by_devs) * upper_factor(len(self.diffs))

    def pooled(self, stretch: list[float]) -> float:
        """The noise pooled with a stretch's own (its successive differences, its deviations from its
        mean), one standard error up over all their differences: while few points are accepted, their
        noise is measured on a handful of differences that a fall from the first batch on swells too,
        and the stretch below (the floor a collapsed policy holds) shows the reward's noise as well."""
        mean = sum(stretch) / len(stretch)
        diffs = [*self.diffs, *(abs(b - a) for a, b in pairwise(stretch))]
        devs = [*self.devs, *(abs(v - mean) for v in stretch)]
        if not diffs:
            return 0.0
        by_diffs = sum(diffs) / len(diffs) * _MEAN_ABS_DIFF_TO_SIGMA
        by_devs = sum(devs) / len(devs) * _MEAN_ABS_DEV_TO_SIGMA
        return max(by_diffs, by_devs) * upper_factor(len(diffs))


class RewardWatch:
    """reward_collapse of an RL or preference run (the first reward field it logs)."""

    reports: ClassVar[tuple[str, ...]] = tuple(KINDS)
    needs: ClassVar[tuple[str, ...]] = ("own_objective", "extra")  # see base.Detector

    def __init__(self, limits: RewardLimits, rank: int | None = None) -> None:
        self.lim = limits
        self.rep = Reporter(rank)
        self._reset()

    def _reset(self) -> None:
        lim = self.lim
        self._level = _Level(lim.level_window)
        self._noise = _Noise(lim.noise_window)
        self._recent: deque[float] = deque(maxlen=lim.noise_window)  # the accepted rewards: their rate
        self._last: tuple[int, float] | None = None  # the last accepted point
        self._last_step: int | None = None
        self._first: float | None = None  # the first full level
        self._best: float | None = None
        self._low: float | None = None  # the lowest level held before the best
        self._lowest: float | None = None
        self._last_good: int | None = None  # the last step whose reward was at its best level or above
        self._down: list[tuple[int, float, float | None, float | None]] = []  # step, reward, entropy, length
        self._up = 0
        self._entropy, self._length = _Level(), _Level()
        self._at_best: tuple[float | None, float | None] = (None, None)
        self._improved_at: int | None = None  # the step the level last made a new best, by two sigmas
        self._improved_level: float | None = None
        self._fell = False  # whether a collapse was told since the run (re)started

    def is_collapsed(self) -> bool:
        """Whether a collapse holds now (the learning-signal rule leaves its ties to it)."""
        return bool(self.rep.on)

    def fell(self) -> bool:
        """Whether a collapse was told on the run (the whole-run rule leaves such a run to it)."""
        return self._fell

    def improved_step(self) -> int | None:
        """The step the reward's level last made a new best by two sigmas (the KL runaway's yardstick)."""
        return self._improved_at

    def observe(self, point: Signal, out: list[Finding]) -> None:
        """The step's reward, on an RL or preference run; a run judged by the SFT loss has none."""
        extra = point.rec.extra
        if point.objective in (None, LOSS_OBJECTIVE) or not extra or extra.get("eval"):
            return
        if point.batch is not None and (point.batch.again or point.batch.echo):
            return  # the reward of a rollout batch judged already, logged again (detect/rollouts.py)
        r = first(extra, REWARD_KEYS)
        if r is not None:
            self.judge(point.rec.step, r[0], r[1], extra, out)

    def judge(self, step: int, key: str, value: float, extra: Mapping[str, Any], out: list[Finding]) -> None:
        if self._last_step is not None and step <= self._last_step:
            self._reset()  # a restart: the log goes back, a new run begins
        self._last_step = step
        found_e, found_n = first(extra, ENTROPY_KEYS), first(extra, LENGTH_KEYS)
        e, n = (found_e[1] if found_e else None), (found_n[1] if found_n else None)
        if self._is_low(value):
            self._down.append((step, value, e, n))
            self._up = 0
            if self.rep.on:
                self.rep.report(out, "reward_collapse", key, step, True)
            elif (
                len(down := self._judged()) >= self.lim.collapse_points
                and self.fell_from_best(down, 0.0 if key in _START_AT_ZERO else None) is not None
                and not self._waits(down)
            ):
                self._report(key, value, out)
            return
        if self.rep.on:
            self._up += 1
            if self._up < self.lim.collapse_points:
                return  # one point back up is not the policy back
            self.rep.report(out, "reward_collapse", key, step, False)
        else:
            for s_, v, e_, n_ in self._down:  # a dip, not a collapse: its points are the reward's
                self._take(s_, v, e_, n_)
        self._down.clear()
        self._take(step, value, e, n)

    def fell_from_best(self, down: list[float], start: float | None = None) -> float | None:
        """The best level, when the mean of the low points ``down`` lies far enough below it to be a
        collapse. While the level is young (fewer than ``level_window`` points), the noise is pooled with
        the low points' own. ``start``: the value the field holds at a run's first step by construction;
        the best must lie above it by as much as the fall must be deep."""
        best, sigma, m = self._best, self._noise.sigma, len(down)
        if best is None or len(self._noise.diffs) < 2 or sigma <= 0.0:
            return None
        if self._young():
            sigma = self._noise.pooled(down)
            if sigma <= 0.0:
                return None
        mean = sum(down) / m
        se_best = _MEDIAN_SE * sigma / math.sqrt(len(self._level.values))
        margin = 2 * se_best + self.lim.collapse_z * math.sqrt(se_best**2 + sigma**2 / m)
        if self._low is not None and best > self._low:
            margin = max(margin, self.lim.collapse_share * (best - self._low))
        if start is not None and best - start <= margin:
            return None
        return best if mean < best - margin else None

    def _judged(self) -> list[float]:
        """The low points the collapse is judged on: all of them; while the level is young, those from the
        point where they lie most significantly below the best on (where the collapse is dated). The noise
        of a young level is pooled with the low points' own, and a slide down to the floor is no noise of
        the floor: a reward falling from 0.45 to 0 over five batches, then held there, would otherwise be
        judged on a noise swollen by its own slide."""
        values = [d[1] for d in self._down]
        if not self._young() or self._best is None:
            return values
        best = self._best
        return values[max(range(len(values)), key=lambda i: _suffix_z(best, values[i:])) :]

    def _waits(self, down: list[float]) -> bool:
        """Whether the low points may yet be no collapse: the run's recent rewards were at or below them
        often enough to give as many in a row ``CHANCE`` of the time or more; or most of its recent
        rewards, the low points among them, sit exactly at one value above them (a policy pinned at one
        answer strays below it, and comes back to it)."""
        recent = self._recent
        top = max(down)
        if len(recent) >= _YOUNG:
            value, count = Counter([*recent, *down]).most_common(1)[0]
            if 2 * count > len(recent) + len(down) and value > top:
                return True
        hits = sum(v <= top for v in recent)
        if self._young():
            # A share from a handful of rewards: the rule of succession's, one standard error up (three
            # rewards none of them as low still leave a floor the run sits at a third of the time).
            p = (hits + 1) / (len(recent) + 2)
            rate = min(1.0, p + math.sqrt(p * (1 - p) / (len(recent) + 2)))
        else:
            rate = hits / len(recent)
        return bool(rate ** len(down) >= CHANCE)

    def _young(self) -> bool:
        """Whether fewer than a level window of rewards were accepted: a short run, or an early fall."""
        return len(self._level.values) < self.lim.level_window

    def _is_low(self, value: float) -> bool:
        best, sigma = self._best, self._noise.sigma
        if best is None or len(self._noise.diffs) < 2:
            return False
        # While young, a point below every reward accepted is low too: the noise of a handful of points,
        # swollen by a fall among them, would let the floor into the level. Low is only a candidate: the
        # stretch is judged on the noise pooled with its own, and on its chance.
        return value < best - sigma or (self._young() and value < min(self._level.values))

    def _take(self, step: int, value: float, e: float | None, n: float | None) -> None:
        self._entropy.add(e)
        self._length.add(n)
        self._accept(step, value)

    def _accept(self, step: int, value: float) -> None:
        level = self._level.level
        if self._last is not None and level is not None:
            self._noise.add(abs(value - self._last[1]), abs(value - level))
        self._last = (step, value)
        self._level.add(value)
        self._recent.append(value)
        if value >= (self._best if self._best is not None else value):
            self._last_good = step
        n, level = len(self._level.values), self._level.level
        if n < min(_YOUNG, self.lim.level_window) or level is None:
            return
        if n == self.lim.level_window and self._first is None:
            self._first = level
        self._lowest = level if self._lowest is None else min(self._lowest, level)
        if self._best is None or level > self._best:
            self._best, self._low = level, self._lowest
            self._at_best = (self._entropy.level, self._length.level)
            # An improvement the KL runaway's yardstick moves for: two sigmas above the last one, not the
            # level wandering up by noise while the KL runs away.
            if self._improved_level is None or level > self._improved_level + 2 * self._noise.sigma:
                self._improved_at, self._improved_level = step, level

    def _report(self, key: str, value: float, out: list[Finding]) -> None:
        # Dated where the fall is most significant (a dip just before it is not its start).
        best, values = self._best or 0.0, [d[1] for d in self._down]
        start = max(range(len(values)), key=lambda i: _suffix_z(best, values[i:]))
        del self._down[:start]
        first_step = self._down[0][0]
        ev: dict[str, Any] = {
            "value": rounded(value),
            "best_level": rounded(self._best),
            "initial_level": rounded(self._first),
            "mean_since": rounded(sum(d[1] for d in self._down) / len(self._down)),
            "noise_sigma": rounded(self._noise.sigma, 4),
            "points_down": len(self._down),
        }
        if self._last_good is not None and self._last_good < first_step:
            # Informational: the collapse's own start is its onset (a rollback goes before it); the
            # reward's last best may lie a noisy while earlier, and a rollback there loses more than it must.
            ev["last_good_step"] = self._last_good
        self._fell = True
        why = self._what_it_became(ev)
        cause = None
        if why:
            cause = f"{KINDS['reward_collapse'].cause}; {why}"
        self.rep.report(out, "reward_collapse", key, first_step, True, evidence=ev, cause=cause)

    def _what_it_became(self, ev: dict[str, Any]) -> str:
        """The entropy and the length while down, against their levels at the reward's best: what the
        policy turned into."""
        e0, n0 = self._at_best
        # The latest point: the policy as far gone as it is when the collapse is told.
        e1, n1 = self._down[-1][2], self._down[-1][3]
        said = []
        if e0 and e1 and e0 > 0 and e1 > 0 and not 1 / _RUNAWAY < e1 / e0 < _RUNAWAY:
            ev["entropy"], ev["entropy_at_best"] = rounded(e1, 4), rounded(e0, 4)
            if e1 > e0:
                said.append(f"the entropy ran away from {e0:.3g} to {e1:.3g}: it emits near-random text")
            else:
                said.append(f"the entropy collapsed from {e0:.3g} to {e1:.3g}: it repeats a few tokens")
        if n0 and n1 and n0 > 0 and not 1 / _RUNAWAY < n1 / n0 < _RUNAWAY:
            ev["length"], ev["length_at_best"] = rounded(n1, 4), rounded(n0, 4)
            what = "longer: it rambles to the limit" if n1 > n0 else "shorter: it stops at once"
            said.append(f"completions went from {n0:.4g} to {n1:.4g} tokens, {what}")
        return "; ".join(said)


def _suffix_z(best: float, values: list[float]) -> float:
    """How far below ``best`` the mean of ``values`` lies, times the square root of their number."""
    return (best - sum(values) / len(values)) * math.sqrt(len(values))
