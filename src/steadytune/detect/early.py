"""Rules that need no baseline window: a short run that climbs, a loss that falls to almost nothing.

- **divergence in a short stretch.** The first ``early_points`` points of a run (or
  of a snippet of a gappy log) have no level to compare with, so the spike rules
  are blind there. A loss that rises from its first point ``early_rises`` times in a row, by
  ``early_rise`` in log space in all (1.5x) and by ``early_z`` times the noise of
  a difference, is climbing away: healthy fine-tunes and pretraining runs fall
  from their first point, and noise does not rise several points in a row that far.
  The noise is the smaller of the prior and the scatter of the climb's own steps:
  a climb by steady steps is not noise, however large the steps.
- **collapse by falling.** A training loss whose level sinks below
  ``collapse_fraction`` of where the run began (its first point or first full level,
  the higher) *and* below
  ``collapse_memorized`` nats (per-token perplexity 1.02) predicts the training
  tokens almost surely: memorization over many epochs, or a data/label bug (labels
  leaking into inputs, a constant target). When the run evaluates, the eval loss
  is the judge: still near its best, the model generalizes, so nothing is raised.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from steadytune.detect.base import Finding, Reporter, rounded
from steadytune.detect.points import LossPoint, Signal
from steadytune.detect.stats import upper_factor

# Where a climb seen from the segment's first point is handed: (step, loss, first rise, log loss
# at the start, rises, out). The loss series holds it as its divergence from then on.
HoldClimb = Callable[[int, float, int, float, int, list[Finding]], None]


@dataclass(frozen=True, slots=True)
class ShortRiseLimits:
    """As ``detect.loss`` names them (docs/detectors.md)."""

    noise_prior: float
    early_points: int
    early_rises: int
    early_rise: float
    early_z: float


class ShortRiseWatch:
    """Divergence from consecutive rises at the start of a run or of a snippet."""

    reports: ClassVar[tuple[str, ...]] = ("divergence",)

    def __init__(
        self,
        limits: ShortRiseLimits,
        hold: HoldClimb | None = None,
        metric: str = "loss",
        rank: int | None = None,
    ) -> None:
        """``hold``: the loss series' :meth:`~.loss.LossWatch.hold_climb`, which takes a climb over."""
        self.metric = metric
        self.rep = Reporter(rank)
        self._hold = hold
        self.lim = limits
        self._seen = 0  # points in the current segment
        self._run_start: tuple[int, float] | None = None  # first point of the current run of rises
        self._rises = 0
        self._last: float | None = None
        self._first_rise = 0
        self._steps: list[float] = []  # the log-space increments of the current climb
        self._known: float | None = None  # the run's noise when this segment began after a gap

    def observe(self, point: Signal, out: list[Finding]) -> None:
        """Judge the loss point the loss series made of this step; a climb seen is handed over."""
        lp = point.loss
        if lp is None:
            if not point.by_loss_rules and self.rep.on:
                self.rep.end_all(out, point.rec.step)  # a loss that turned out to be no cross-entropy
            return
        if self._seen > self.lim.early_points and not lp.new_segment and not self.rep.on:
            # Past the segment's first points nothing can rise from its first any more, and nothing
            # is raised to clear: only the count and the last point matter until the next segment.
            self._seen += 1
            self._last = lp.y
            return
        climb = self.judge(lp, out, point.held, point.run_noise)
        if climb is not None and self._hold is not None:
            self._hold(lp.step, lp.loss, *climb, out)

    def judge(
        self, lp: LossPoint, out: list[Finding], held: bool = False, run_noise: float | None = None
    ) -> tuple[int, float, int] | None:
        """Judge one accepted or held loss point; ``held``: the loss watch already holds this climb.

        ``run_noise``: the run's measured noise per point (one standard error up), None while
        no difference is known; read at a segment's first point, which after a gap is a
        snippet with a baseline behind it.

        One anomaly per climb: while the spike rules hold a divergence of the same loss,
        this rule neither raises nor resolves one (the two would flap the same kind).
        Returns (first step above the start, log loss at the start, rises) when it raises one,
        for the loss watch to hold the climb from there on.
        """
        if held:
            self.rep.on.clear()  # handed over: the loss watch resolves it
            out = []
        if lp.new_segment:
            self._seen, self._rises, self._last, self._run_start = 0, 0, None, None
            self._known = run_noise
        self._seen += 1
        last, self._last = self._last, lp.y
        if last is None or lp.y <= last:
            self._rises, self._run_start = 0, (lp.step, lp.y)
            self._steps.clear()
            if self.rep.on and last is not None:
                self.rep.report(out, "divergence", self.metric, lp.step, False)
            return None
        self._rises += 1
        self._steps.append(lp.y - last)
        if self._rises == 1:
            self._first_rise = lp.step  # the climb is dated from its first point above the start
        # Only a climb from the first point of the run (or snippet) counts: a rise that begins
        # later has a baseline before it, and the spike and divergence rules judge it.
        if self._run_start is None or self._seen != self._rises + 1 or self._seen > self.lim.early_points:
            return None
        start_y = self._run_start[1]
        rise = lp.y - start_y
        # The end-to-end rise must stand out of the noise of two points (sqrt 2 sigma), for a
        # noise that explains the climb least badly: the prior's, or the scatter of the climb's
        # own increments (a steady climb rises by similar steps; noise rises by random ones).
        # Each is taken one standard error up, as few points are known: the scatter of n
        # increments about their own mean has n - 1 degrees of freedom, not n.
        sigma = min(self.lim.noise_prior, _increment_noise(self._steps)) * upper_factor(self._rises - 1)
        # After a gap the run is no stranger: the noise measured before it is still its noise (a
        # gap moves the level, not the batches' scatter). A snippet of a per-step run whose losses
        # jump 2x from batch to batch rises three times by chance after one gap or another; the
        # rule is for a run that has no noise of its own yet, so it cannot ignore the one it has.
        if self._known is not None:
            sigma = max(sigma, self._known)
        needed = max(self.lim.early_rise, self.lim.early_z * math.sqrt(2.0) * sigma)
        if self._rises >= self.lim.early_rises and rise >= needed:
            first = not self.rep.on
            ev = None
            if first:
                ev = {
                    "value": rounded(lp.loss),
                    "first": rounded(math.exp(start_y)),
                    "rise_ratio": rounded(math.exp(rise), 4),
                    "rises": self._rises,
                    "threshold_ratio": rounded(math.exp(self.lim.early_rise), 4),
                    "threshold_rises": self.lim.early_rises,
                }
            self.rep.report(out, "divergence", self.metric, self._first_rise, True, evidence=ev)
            return self._first_rise, start_y, self._rises
        return None


def _increment_noise(steps: list[float]) -> float:
    """Per-point noise implied by the scatter of successive increments (var of a difference is 2 sigma^2)."""
    n = len(steps)
    mean = sum(steps) / n
    var = sum((d - mean) ** 2 for d in steps) / max(1, n - 1)
    return math.sqrt(var / 2.0)


@dataclass(frozen=True, slots=True)
class FallCollapseLimits:
    """``collapse_*`` as ``detect.loss`` names them; ``rise`` is ``detect.eval.rise``."""

    collapse_fraction: float
    collapse_memorized: float
    rise: float


class FallCollapseWatch:
    """loss_collapse from a level that sank to a tiny fraction of where the run began."""

    reports: ClassVar[tuple[str, ...]] = ("loss_collapse",)

    def __init__(self, limits: FallCollapseLimits, metric: str = "loss", rank: int | None = None) -> None:
        self.metric = metric
        self.rep = Reporter(rank)
        self.lim = limits
        self._initial: float | None = None
        self._first: float | None = None
        self._eval_best: float | None = None
        self._eval_last: float | None = None
        self._limit = math.log(max(limits.collapse_memorized, 1e-12))
        self._log_fraction = math.log(limits.collapse_fraction)

    def observe(self, point: Signal, out: list[Finding]) -> None:
        """Note the step's eval loss, then judge the loss series' level."""
        rec = point.rec
        value = rec.eval_loss
        if value is not None and math.isfinite(value) and value > 0:
            y = math.log(value)
            self._eval_last = y
            self._eval_best = y if self._eval_best is None else min(self._eval_best, y)
        lp = point.loss
        if lp is None:
            if not point.by_loss_rules and self.rep.on:
                self.rep.end_all(out, point.rec.step)  # a loss that turned out to be no cross-entropy
            return
        t, epoch = point.level_of, rec.epoch
        level, level_full = t.level, t.level_full
        if not lp.accepted:
            return
        if self._first is None:
            self._first = lp.y
        if not level_full:
            return
        if self._initial is None:
            # Where training began: the first full level spans the first eight logged points, which in
            # a coarse log already hold most of a fast fall, so the first point is taken when higher.
            # Its noise (a few percent) does not matter against a 100x fall; a low first outlier is
            # covered by the level, a high one still needs the loss under `collapse_memorized` nats.
            self._initial = max(level, self._first)
            return
        low = level < self._initial + self._log_fraction and level < self._limit
        if low and not self._eval_healthy():
            ev = None
            if not self.rep.on:
                ev = {
                    "level": rounded(math.exp(level)),
                    "initial_level": rounded(math.exp(self._initial)),
                    "fraction": rounded(math.exp(level - self._initial), 4),
                    "threshold_fraction": self.lim.collapse_fraction,
                    "threshold_loss": self.lim.collapse_memorized,
                    "epoch": rounded(epoch, 4),
                    "eval_loss": rounded(math.exp(self._eval_last)) if self._eval_last is not None else None,
                    "eval_best": rounded(math.exp(self._eval_best)) if self._eval_best is not None else None,
                }
            self.rep.report(
                out, "loss_collapse", self.metric, lp.step, True, "warning", ev, self._cause(epoch)
            )
        elif self.rep.on and (level > self._limit + 0.5 or self._eval_healthy()):
            self.rep.report(out, "loss_collapse", self.metric, lp.step, False)

    def _eval_healthy(self) -> bool:
        if self._eval_last is None or self._eval_best is None:
            return False
        return self._eval_last - self._eval_best <= self.lim.rise

    def _cause(self, epoch: float | None) -> str:
        seen = f" after {epoch:.3g} epochs" if epoch else ""
        if self._eval_last is not None:
            return (
                f"the training loss fell to almost nothing{seen} while the eval loss rose above its best: "
                "the model memorizes the training set"
            )
        return (
            f"the training loss fell to almost nothing{seen}: the model memorizes the training set, or a "
            "data/label bug makes the target trivial (labels leaking into the inputs); no eval loss to tell"
        )
