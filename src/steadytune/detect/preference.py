"""no_learning_signal for a DPO run: its loss stays above ln 2 while its margins do not grow.

A DPO run starts at a known point. At its first step the policy is its reference, so
every pair's implicit reward margin is exactly 0 and the sigmoid loss is exactly
ln 2 (0.693). The optimizer minimizes that loss, so a run that learns the
preferences brings it below ln 2 as its margins grow: a training loss that settles
**above** its starting value is an objective made worse than doing nothing. Two runs
do that:

- one that learns the **wrong way**: chosen and rejected swapped in the data, a sign
  error, a wrong ``beta``: its margins go below 0 and the loss rises above ln 2;
- one whose policy moves but **not towards the preferences** (the pairs' margins
  spread around 0, which lifts the mean of the convex sigmoid loss above ln 2 while
  the mean margin stays at 0): a run that learns nothing of what the pairs say.

So, over every logged training point since the run's start (the log's first step
within two logging intervals of 0, and at least ``_MIN_POINTS`` (10) of them:
fewer say nothing of a level), with the DPO margins logged (``rewards/margins``, or
``rewards/chosen`` minus ``rewards/rejected``), one episode is raised when:

- the loss's mean lies ``_LEVEL_Z`` (3) standard errors above ln 2;
- the margins' mean is not ``_T`` (2) standard errors above 0;
- and the margins do not rise either (a least-squares slope under ``_T`` standard
  errors): a run on its way up is learning, slowly.

The standard errors are read from the residuals about each series' least-squares
line (a run that swaps its preferences slides steadily: its spread is its trend, not
its noise), widened for their lag-one autocorrelation (``√((1+r)/(1−r))``, r at most
0.9: a level that wanders holds fewer independent points than it has), as the
whole-run reward rule does (:mod:`.flat`). The test runs at every point up to 64,
then every n/32 points: the whole run costs O(n) to judge. Each point keeps two floats.
The margins decide, not the loss alone: IPO and
SimPO runs log under the same trainer with a loss that does not start at ln 2, and
their margins rise when they learn. Margins whose mean or slope lies 2 standard errors
below 0 are told as the wrong way. The kind is ``no_learning_signal`` (an alert: a restart cannot fix
swapped labels or a sign error).

Once raised, the episode holds until the evidence turns: the loss's mean at or below
ln 2, or the margins' mean ``_LEVEL_Z`` standard errors above 0. The test is repeated as
the points come in, so its figure wanders about the threshold: clearing it when the loss
was merely under 2 standard errors up split one swapped or unlearned run into two
episodes (generated DPO runs of 100 and 600 points: 1 of 108 swapped, 10 of 108
unlearned), and a figure between 0 and 3 is no sign that the run began to learn.

What it leaves out: a run whose loss stays **at** ln 2 within its noise (an LR near
0, a ``beta`` near 0) lifts no level above ln 2; margins exactly 0 are the windowed
rule's (:mod:`.learning`), tiny nonzero ones are not told. A loss-only log (no margins)
is not judged: nothing in it says the loss is a DPO loss at all.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, ClassVar

from steadytune.detect.base import Finding, Reporter, rounded
from steadytune.detect.points import Signal

LN2 = math.log(2.0)
_MIN_POINTS = 10  # fewer points since the start say nothing of where the loss settled
_LEVEL_Z = 3.0  # the loss's mean this many standard errors above ln 2: it settled above its start
_T = 2.0  # the margins' mean (or slope) this many standard errors above 0: they grow
_START_INTERVALS = 2  # a log whose first step lies within this many logging intervals of 0 shows the start
_MAX_R = 0.9  # the largest lag-one autocorrelation the standard errors are widened for
_DPO = "preference (DPO)"


@dataclass(frozen=True, slots=True)
class PreferenceLimits:
    """None: ln 2 and the significance levels are a priori (module docstring)."""


@dataclass(frozen=True, slots=True)
class Level:
    """A series' mean with its standard error, and its least-squares slope's t."""

    mean: float
    se: float
    slope_t: float

    def t(self, against: float = 0.0) -> float:
        """The mean above ``against`` in standard errors."""
        d = self.mean - against
        return d / self.se if self.se > 0 else (0.0 if d == 0 else math.copysign(math.inf, d))


def level(values: Sequence[float]) -> Level:
    """The mean of ``values`` (3 or more) and its standard error, read from the residuals about their
    least-squares line and widened for the residuals' lag-one autocorrelation: a series that trends
    has a spread its noise does not (a run swapping its preferences slides steadily), and one that
    wanders holds fewer independent points than it has."""
    n = len(values)
    xm = (n - 1) / 2
    ym = math.fsum(values) / n
    sxx = n * (n * n - 1) / 12
    slope = math.fsum((i - xm) * (y - ym) for i, y in enumerate(values)) / sxx
    resid = [y - ym - slope * (i - xm) for i, y in enumerate(values)]
    ss = math.fsum(e * e for e in resid)
    if ss <= 0.0:
        return Level(ym, 0.0, 0.0 if slope == 0 else math.copysign(math.inf, slope))
    r1 = min(max(math.fsum(a * b for a, b in pairwise(resid)) / ss, 0.0), _MAX_R)
    widen = math.sqrt((1 + r1) / (1 - r1))
    sd = math.sqrt(ss / (n - 2)) * widen
    return Level(ym, sd / math.sqrt(n), slope / (sd / math.sqrt(sxx)))


def margin(extra: Mapping[str, Any]) -> float | None:
    """The batch's mean DPO margin: ``rewards/margins``, else chosen minus rejected (None: not logged)."""
    vals = {k: extra.get(k) for k in ("rewards/margins", "rewards/chosen", "rewards/rejected")}
    num = {k: float(v) for k, v in vals.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if "rewards/margins" in num:
        return num["rewards/margins"] if math.isfinite(num["rewards/margins"]) else None
    if "rewards/chosen" in num and "rewards/rejected" in num:
        d = num["rewards/chosen"] - num["rewards/rejected"]
        return d if math.isfinite(d) else None
    return None


# The windowed rule's advice (completions, the reward function, num_generations) is for RL: a DPO
# run has no completions or reward function, its pairs and its loss are what to look at.
_FIX = (
    "check that chosen and rejected are not swapped in the data, and the loss's sign in a custom "
    "trainer; check beta and the LR. A restart will not fix it"
)


class PreferenceWatch:
    """no_learning_signal for a DPO run whose loss settled above ln 2 while its margins did not grow."""

    reports: ClassVar[tuple[str, ...]] = ("no_learning_signal",)
    needs: ClassVar[tuple[str, ...]] = ("own_objective", "extra")  # see base.Detector

    def __init__(
        self,
        limits: PreferenceLimits | None = None,
        rank: int | None = None,
        told: Callable[[], bool] | None = None,
    ) -> None:
        self.rep = Reporter(rank)
        self._told = told or (lambda: False)  # the windowed rule told the run: one trouble, one episode
        self._loss = array("d")
        self._margin = array("d")
        self._steps: list[int] = []  # the first two steps: whether the log shows the run's start
        self._start = 0
        self._means = (0.0, 0.0)  # the loss's and the margins' means, as last judged
        self._ever = False  # whether this rule raised anything on the run

    def told(self) -> bool:
        """Whether this rule raised anything on the run (the whole-run reward rule leaves it to this one)."""
        return self._ever

    def observe(self, point: Signal, out: list[Finding]) -> None:
        """Add the step's loss and margin; judge the run since its start."""
        rec = point.rec
        if point.objective != _DPO or not rec.extra or rec.extra.get("eval"):
            return
        m = margin(rec.extra)
        if m is None or rec.loss is None or not math.isfinite(rec.loss):
            return
        if len(self._steps) < 2:
            self._steps.append(rec.step)
            self._start = self._steps[0]
        self._loss.append(rec.loss)
        self._margin.append(m)
        n = len(self._loss)
        on = self.rep.is_on("no_learning_signal", "loss")
        # Judged at every point up to 64, then every n/32: a whole-run test costs O(n) each time.
        if n < _MIN_POINTS or n % max(1, n // 32) or not self._shows_start():
            if on:  # held as last judged: the episode runs on to this step
                self.rep.report(out, "no_learning_signal", "loss", rec.step, True)
            return
        above, t_mean, t_slope = self._figures()
        if not on and above >= _LEVEL_Z and t_mean < _T and t_slope < _T and not self._told():
            self._raise(rec.step, above, t_mean, t_slope, out)
        elif on:  # held until the level says otherwise
            held = not (above <= 0.0 or t_mean >= _LEVEL_Z)
            self.rep.report(out, "no_learning_signal", "loss", rec.step, held)

    def _shows_start(self) -> bool:
        first, second = self._steps
        return first <= _START_INTERVALS * max(second - first, 1)

    def _figures(self) -> tuple[float, float, float]:
        """The loss's mean above ln 2, the margins' mean above 0 (each in standard errors), and the
        margins' slope t."""
        lo, mo = level(self._loss), level(self._margin)
        self._means = (lo.mean, mo.mean)
        return lo.t(LN2), mo.t(), mo.slope_t

    def _raise(self, step: int, above: float, t_mean: float, t_slope: float, out: list[Finding]) -> None:
        n, (loss_mean, margin_mean) = len(self._loss), self._means
        reversed_ = t_mean <= -_T or t_slope <= -_T  # below 0, or falling from it
        ev = {
            "points": n,
            "loss_mean": rounded(loss_mean),
            "loss_above_ln2_se": rounded(above, 3),
            "margin_mean": rounded(margin_mean),
            "margin_t": rounded(t_mean, 3),
            "margin_slope_t": rounded(t_slope, 3),
            "direction": "reversed" if reversed_ else "none",
            "to_step": step,
        }
        head = (
            f"the DPO loss averaged {loss_mean:.4g} over the {n} logged steps since the start, "
            f"{above:.1f} standard errors above ln 2 (0.693, where every DPO run begins), and the reward "
            f"margins averaged {margin_mean:.3g}"
        )
        if reversed_:
            cause = (
                f"{head}, below 0 (t {t_mean:.1f}, their slope's t {t_slope:.1f}): the policy learns to "
                "prefer the rejected answers (chosen and rejected swapped in the data, a sign error in a "
                "custom loss, a wrong beta)"
            )
        else:
            cause = (
                f"{head}, not significantly above 0 (t {t_mean:.1f}), and not rising: the policy moves, but "
                "not towards the chosen answers (pairs whose labels are noise or swapped in part, an LR too "
                "small for beta, a template that hides the answers from the loss)"
            )
        self._ever = True
        self.rep.report(
            out, "no_learning_signal", "loss", self._start, True, evidence=ev, cause=cause, suggestion=_FIX
        )
