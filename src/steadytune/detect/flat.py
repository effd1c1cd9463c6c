"""no_learning_signal over a whole run: a reward that never rose, told once the run is over.

A live rule cannot tell a reward that never improves from one that improves slowly:
a reward rising from 10 % to 45 % right over 2,000 steps shows a slope of about two
standard errors after 100 points. The run's end can: ``analyze`` of a finished log,
or a live run once it ends, knows the whole run. Its reward's **gain** over the run
is the least-squares line through the rewards against their index, its slope times
the run's length. The reward is **flat** when:

- the gain is **indistinguishable from zero**: under ``_T_SEEN`` (2) standard errors
  up. A reward that rises by a fraction of its noise over 10,000 steps rises
  significantly, and is learning, slowly;
- while **a small gain would have shown**: a true gain of ``rl.flat_gain`` (0.5) of
  the reward's noise per point would have come out significant four times in five
  (80 % power: its standard error at most 0.5 / 2.84 of the noise). A gain of half a
  batch's noise is about the least a reward that learns shows over a run (a reward
  of a few dozen completions a step that rises ten points in a hundred gains more
  than one noise sigma); where the run is too short or too noisy for that, its
  flatness says nothing and nothing is said. This is the rule's minimum span: about
  390 points of uncorrelated noise (``12·(2.84/0.5)²``), more where it is correlated;
- the reward did not fall by more than that either (a fall is not flat: the collapse
  rule and the eye judge it);
- and the rest of the run lies no significantly higher than its start (its first 8,
  16, 32, ... points, up to a tenth of the run; the most significant of them, at a t
  raised for their number, Bonferroni's way): a run that learned in its first dozen
  steps and then held its level learned, whatever its line says.

What it leaves out: a learner whose whole-run gain is below half its noise (a reward
firing on a few completions in a hundred, with four to eight completions a step) is
indistinguishable from a flat one; at the lengths where the test first has its power
(600 points or so), such runs are told a few times in a hundred.

The noise per point is read from successive differences (a trend cancels in them), as
their root mean square over √2: that is the noise's spread whatever its shape, where
their mean absolute size is it only for a bell-shaped noise. A reward at its floor on
most batches with a rare hit (one group of eight, a right answer a few times in a
hundred) is far from bell-shaped: its mean absolute difference read its noise about
1.7x low, so the rule asked for about three times the points to show a gain of half
of it, and such a run that never rose went untold at 400-600 points;
the standard errors from the residuals about the line, widened for their lag-one
autocorrelation (``√((1+r)/(1−r))``: a reward that wanders slowly holds fewer
independent points than it has).

**Most batches without signal.** A run too short for that power (a few dozen points) may still
show that it learned nothing by a second evidence: its groups. Where the record tells which of a
batch's prompt groups tied (:func:`~steadytune.objectives.tied_share`), the run's learning share is
the mean over its kept points of the share of groups that did not tie (a batch whose spread is known
but not per group counts as wholly learning). A run whose learning share is at most
``rl.run_signal_share`` (0.2: four batches in five or more taught nothing), whose ties sit at its low
(their mean reward at or below the run's: ties at the top are a solved task), over at least
``rl.signal_window`` points, and whose reward shows no significant rise (the line and the rest over
the start, as above, without the power asked for) learned nothing the run can show. The windowed
rule (:mod:`.learning`) calls a stretch of ties chance when the run's own rate makes it likely: a
reward firing on one batch in ten may be learning slowly. Once the run is over, that rate is all of
it and the reward did not rise: most of its updates carried nothing, whatever they would have done
later. A slow learner whose reward rises significantly out of its ties is not this.

The log must begin at the run's start (its first step within two logging intervals of
step 0): a log that begins mid-run (a resumed run) does not show the gain made before
it, and a run whose reward holds at its top from there on is saturated, not stuck. A
run the windowed rule, the collapse rule or the DPO loss rule (:mod:`.preference`, on a
DPO run's margins) told already is left to them: one trouble, one episode. The finding
spans the run, at the kind's usual ``warning``: an alert, for a restart cannot fix a
reward function.

Each step costs one float appended; the test runs once, at the end.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from statistics import NormalDist
from typing import Any, ClassVar

from steadytune.detect.base import Finding, Reporter, rounded
from steadytune.detect.points import Signal
from steadytune.objectives import LOSS_OBJECTIVE, REWARD_KEYS, first, tied_share

_T_SEEN = 2.0  # a gain this many standard errors above zero is a gain
_P_SEEN = 1 - NormalDist().cdf(_T_SEEN)  # its one-sided chance under no gain (2.3 %)
_Z_POWER = 0.84  # ...and a true gain this many more above it shows as one four times in five (80 % power)
_FIRST_SHARE = 0.1  # the longest start the rest of the run is compared with: its first tenth
_FIRST_POINTS = 8  # ...and the shortest: a level window's worth
_START_INTERVALS = 2  # a log whose first step lies within this many logging intervals of 0 shows the start


@dataclass(frozen=True, slots=True)
class FlatLimits:
    """As ``detect.rl`` names them (docs/detectors.md)."""

    flat_gain: float
    signal_window: int
    run_signal_share: float


@dataclass(frozen=True, slots=True)
class Gain:
    """A gain over the run, in the reward's units, with its standard error."""

    gain: float
    se: float

    def flat(self, smallest: float) -> bool:
        """Indistinguishable from zero, while a gain of ``smallest`` would have shown (four times in
        five); and no fall past it."""
        return (
            self.gain < _T_SEEN * self.se
            and (_T_SEEN + _Z_POWER) * self.se <= smallest
            and self.gain > -smallest
        )


@dataclass(frozen=True, slots=True)
class Flatness:
    """What the whole-run test read off a reward series."""

    points: int
    noise: float  # the reward's noise per point (successive differences)
    line: Gain  # the line's rise over the run
    after_start: Gain  # the rest of the run's mean over its start's (the most significant start)
    starts: int = 1  # how many starts were tried: the one picked must pass a t raised for their number

    def flat(self, flat_gain: float) -> bool:
        # The chance of a t of 2 or more is shared among the starts tried (Bonferroni, in not_up): a
        # flat run whose first 8, 16, ..., 256 points are each compared with the rest would otherwise
        # pass as learned one time in five or so, by one of them.
        smallest = flat_gain * self.noise
        return self.noise > 0.0 and self.line.flat(smallest) and self.not_up()

    def not_up(self) -> bool:
        """Neither the line nor the rest of the run over its start shows a significant gain (no power
        asked for: :meth:`flat` adds that)."""
        start = self.after_start
        t = NormalDist().inv_cdf(1 - _P_SEEN / self.starts)  # Bonferroni over the starts tried
        return self.line.gain < _T_SEEN * self.line.se and start.gain < t * start.se


def flatness(values: Sequence[float]) -> Flatness | None:
    """The whole-run test's figures for ``values`` in logged order (None under 8 points)."""
    n = len(values)
    if n < 8:
        return None
    noise = math.sqrt(math.fsum((b - a) ** 2 for a, b in pairwise(values)) / (2 * (n - 1)))
    xm = (n - 1) / 2
    ym = math.fsum(values) / n
    sxx = n * (n * n - 1) / 12  # Σ(i − x̄)² over 0..n−1
    slope = math.fsum((i - xm) * (y - ym) for i, y in enumerate(values)) / sxx
    resid = [y - ym - slope * (i - xm) for i, y in enumerate(values)]
    ss = math.fsum(e * e for e in resid)
    s = math.sqrt(ss / (n - 2))
    r1 = math.fsum(a * b for a, b in pairwise(resid)) / ss if ss > 0 else 0.0
    # A wandering reward holds fewer independent points than it has (AR(1): n(1−r)/(1+r)).
    widen = math.sqrt((1 + r1) / (1 - r1)) if 0.0 < r1 < 1.0 else 1.0
    line = Gain(slope * (n - 1), s / math.sqrt(sxx) * (n - 1) * widen)
    start, starts = _start_gain(values, s * widen)
    return Flatness(n, noise, line, start, starts)


def _start_gain(values: Sequence[float], sigma: float) -> tuple[Gain, int]:
    """The rest of the run's mean over its start's, for the start (its first 8, 16, 32, ... points up to a
    tenth of the run) whose gain is the most significant: a rise in the first dozen steps is diluted in
    a tenth of a long run, and a rise over its first tenth in its first few points."""
    n = len(values)
    sizes = {max(1, round(_FIRST_SHARE * n))}
    m = _FIRST_POINTS
    while m < _FIRST_SHARE * n:
        sizes.add(m)
        m *= 2
    total, best = math.fsum(values), None
    for m in sorted(sizes):
        head = math.fsum(values[:m])
        g = Gain((total - head) / (n - m) - head / m, sigma * math.sqrt(1 / m + 1 / (n - m)))
        if best is None or g.gain * best.se > best.gain * g.se:  # the larger t, without dividing by 0
            best = g
    assert best is not None
    return best, len(sizes)


class FlatRewardWatch:
    """no_learning_signal of a finished RL or preference run whose reward never rose (see module doc)."""

    reports: ClassVar[tuple[str, ...]] = ("no_learning_signal",)
    needs: ClassVar[tuple[str, ...]] = ("own_objective", "extra")  # see base.Detector

    def __init__(
        self,
        limits: FlatLimits,
        told: Callable[[], bool] | None = None,
        fell: Callable[[], bool] | None = None,
        anchored: Callable[[], bool] | None = None,
    ) -> None:
        self.lim = limits
        # Whether the windowed rule, the collapse rule or the DPO loss rule (detect/preference.py) told
        # this run already: one trouble, one episode.
        self._told = told or (lambda: False)
        self._fell = fell or (lambda: False)
        self._anchored = anchored or (lambda: False)
        self.rep = Reporter()
        self._reset()

    def _reset(self) -> None:
        self._values = array("d")
        self._steps: list[int] = []  # the first few steps: where the log begins, and its interval
        self._first_step: int | None = None
        self._last_step: int | None = None  # the last step whose reward was kept
        self._end: int | None = None  # the last step seen: where the run ends
        self._key = "reward"
        self._done = False
        self._learning = 0.0  # the learning groups' shares summed over the kept points (a spread batch: 1)
        self._tied = 0  # the kept points whose every group tied...
        self._tied_reward = 0.0  # ...and their rewards summed

    def observe(self, point: Signal, out: list[Finding]) -> None:
        """Keep the step's reward (an RL or preference run's, each rollout batch once)."""
        extra = point.rec.extra
        if point.objective in (None, LOSS_OBJECTIVE) or not extra or extra.get("eval"):
            return
        self._end = point.rec.step
        if point.batch is not None and (point.batch.again or point.batch.echo):
            return  # a rollout batch's reward logged again (detect/rollouts.py)
        found = first(extra, REWARD_KEYS)
        if found is None or not math.isfinite(found[1]):
            return
        step = point.rec.step
        if self._last_step is not None and step <= self._last_step:
            self._reset()  # a restart: the log goes back, a new run begins
        self._last_step = step
        if self._first_step is None:
            self._first_step = step
        if len(self._steps) < 17:
            self._steps.append(step)
        self._key = found[0]
        self._values.append(found[1])
        # The engine read the batch's tie already (detect/rollouts.py); a point made without it reads it here.
        tied = point.batch.tied if point.batch is not None else tied_share(extra)
        self._learning += 1.0 - (tied or 0.0)
        if tied == 1.0:
            self._tied += 1
            self._tied_reward += found[1]

    def finish(self, out: list[Finding]) -> None:
        """The run is over: is its reward flat over all of it?"""
        if self._done or self._told() or self._fell() or self._anchored() or not self._from_start():
            return
        self._done = True
        f = flatness(self._values)
        if f is None:
            return
        if f.flat(self.lim.flat_gain):
            self._tell_flat(f, out)
        elif self._mostly_tied(f):
            self._tell_tied(f, out)

    def _mostly_tied(self, f: Flatness) -> bool:
        """Most of the run's batches carried no learning group, tied at the run's floor (not solved), and
        the reward never rose."""
        n = f.points
        share = self.lim.run_signal_share
        return (
            share > 0.0
            and n >= self.lim.signal_window
            and self._learning <= share * n
            and self._tied_reward / max(self._tied, 1) <= math.fsum(self._values) / n
            and f.not_up()
        )

    def _span(self) -> tuple[int, int]:
        assert self._first_step is not None and self._last_step is not None
        return self._first_step, max(self._last_step, self._end or self._last_step)

    def _tell_tied(self, f: Flatness, out: list[Finding]) -> None:
        start, end = self._span()
        share = self._learning / f.points
        ev: dict[str, Any] = {
            "points": f.points,
            "whole_run": True,
            "learning_share": rounded(share, 3),
            "tied_points": self._tied,
            "gain": rounded(f.line.gain),
            "gain_se": rounded(f.line.se),
            "to_step": end,
        }
        cause = (
            f"over the whole run ({f.points} logged steps) {share:.0%} of the prompt groups could teach the "
            f"policy anything (in {self._tied} batches every group's completions earned the same reward, "
            f"at the run's low), and the {self._key} never rose (moved {f.line.gain:+.3g}, standard error "
            f"{f.line.se:.2g}): most updates carried no signal. A reward that rarely fires, a task too hard "
            "for the group size (more completions per prompt, easier prompts first), or a reward that "
            "scores completions alike"
        )
        self.rep.report(out, "no_learning_signal", self._key, start, True, evidence=ev, cause=cause)
        self.rep.report(out, "no_learning_signal", self._key, end, True)

    def _tell_flat(self, f: Flatness, out: list[Finding]) -> None:
        first_step, end = self._span()
        ev: dict[str, Any] = {
            "points": f.points,
            "whole_run": True,
            "gain": rounded(f.line.gain),
            "gain_se": rounded(f.line.se),
            "gain_after_start": rounded(f.after_start.gain),
            "noise_sigma": rounded(f.noise),
            "smallest_gain_seen": rounded(self.lim.flat_gain * f.noise),
            "to_step": end,
        }
        cause = (
            f"over the whole run ({f.points} logged steps) the {self._key} moved {f.line.gain:+.3g} "
            f"(standard error {f.line.se:.2g}), against a noise of {f.noise:.3g} per step: a gain of "
            f"{self.lim.flat_gain * f.noise:.3g} would have shown, and none did. The policy learned "
            "nothing the reward sees: a reward function that scores every completion alike up to noise, "
            "a task too hard (or already solved) for the policy, an LR or a KL penalty that keeps the "
            "policy at its reference, or updates that do not reach the model"
        )
        self.rep.report(out, "no_learning_signal", self._key, first_step, True, evidence=ev, cause=cause)
        self.rep.report(out, "no_learning_signal", self._key, end, True)

    def _from_start(self) -> bool:
        """Whether the log begins at the run's start (within two logging intervals of step 0)."""
        steps = self._steps
        if self._first_step is None or len(steps) < 2:
            return False
        gaps = sorted(b - a for a, b in pairwise(steps) if b > a)
        interval = gaps[len(gaps) // 2] if gaps else 1
        return self._first_step <= _START_INTERVALS * max(interval, 1)
