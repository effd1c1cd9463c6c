"""Overfitting: the eval loss ``rise`` above its best for ``rising_evals`` evaluations while the training
loss has not risen. And an evaluation whose loss is NaN or Inf (``nan_eval``)."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import ClassVar

from steadytune.detect.base import Finding, KindInfo, Reporter, rounded
from steadytune.detect.points import Signal
from steadytune.objectives import LOSS_OBJECTIVE

KINDS: dict[str, KindInfo] = {
    "overfitting": KindInfo(
        "overfitting",
        "the eval loss rises while the training loss still falls: the model memorises the training set",
        "stop at the best checkpoint (load_best_model_at_end), fewer epochs, more data or regularisation",
        "warning",
        lasting=True,
    ),
    "nan_eval": KindInfo(
        "NaN/Inf in an evaluation",
        "the model's outputs on some eval sample are NaN/Inf while training goes on: an fp16/bf16 overflow "
        "on the eval's longer or larger batches, an eval set whose labels are all masked (a mean over no "
        "tokens), weights that only the eval's inputs push out of range",
        "evaluate in bf16 or fp32, check that the eval set keeps some unmasked labels after truncation, and "
        "do not pick the best checkpoint or stop early on these evaluations",
        "warning",
    ),
}


@dataclass(frozen=True, slots=True)
class OverfitLimits:
    """As ``detect.eval`` names them (docs/detectors.md)."""

    min_evals: int
    rise: float
    rising_evals: int


_EVAL_NOISE_UNITS = 4.5  # an eval rise counts past this many of the evaluations' own noise above the best


class OverfitWatch:
    """Eval loss rising above its best while the training loss does not rise."""

    reports: ClassVar[tuple[str, ...]] = ("overfitting", "nan_eval")
    needs: ClassVar[tuple[str, ...]] = ("eval_loss",)

    def __init__(self, limits: OverfitLimits, metric: str = "eval_loss", rank: int | None = None) -> None:
        self.metric = metric
        self.rep = Reporter(rank)
        self.lim = limits
        self._n = 0
        self._best: float | None = None
        self._best_step = 0
        self._train_at_best: float | None = None
        self._above = 0
        self._last2: tuple[float, ...] = ()  # the two evaluations before this one (log)
        # |second differences| of the evaluations, kept sorted: their noise, trend removed. Sorted as they
        # come, not at each evaluation: a run evaluated every few steps has tens of thousands of them.
        self._curv: list[float] = []

    def observe(self, point: Signal, out: list[Finding]) -> None:
        """Judge the step's eval loss against the training loss level (log space) and its noise."""
        value = point.rec.eval_loss
        if value is None:
            return
        step = point.rec.step
        t = point.level_of
        train_level, train_noise = (t.level, t.sigma) if t.n_level else (None, 0.0)
        self._nonfinite(point, value, out)
        if not math.isfinite(value) or value <= 0:
            return
        y = math.log(value)
        self._n += 1
        if len(self._last2) == 2:
            bisect.insort(self._curv, abs(y - 2.0 * self._last2[1] + self._last2[0]))
        self._last2 = (*self._last2[-1:], y)
        if self._best is None or y < self._best:
            self._best, self._best_step, self._train_at_best = y, step, train_level
            self._above = 0
            self.rep.report(out, "overfitting", self.metric, step, False)
            return
        rise = y - self._best
        need = self._rise_needed()
        self._above = self._above + 1 if rise > need else 0
        # "Still falling" tolerates the wobble of a converged training level (a median of 8
        # noisy points moves by about 0.44 sigma), not a rise.
        slack = 0.05 + 2.0 * 0.44 * train_noise
        train_ok = (
            train_level is None or self._train_at_best is None or train_level <= self._train_at_best + slack
        )
        if self._n >= self.lim.min_evals and self._above >= self.lim.rising_evals and train_ok:
            ev = None
            if not self.rep.is_on("overfitting", self.metric):
                ev = {
                    "value": rounded(value),
                    "best": rounded(math.exp(self._best)),
                    "best_step": self._best_step,
                    "rise_ratio": rounded(math.exp(rise), 4),
                    "threshold_ratio": rounded(math.exp(need), 4),
                    "evals_above": self._above,
                }
            self.rep.report(out, "overfitting", self.metric, step, True, evidence=ev)
        elif rise <= 0.5 * need:
            self.rep.report(out, "overfitting", self.metric, step, False)

    def _nonfinite(self, point: Signal, value: float, out: list[Finding]) -> None:
        """An eval loss of NaN or Inf: the model's outputs on some eval sample are not finite.

        The training loss may well be finite: an fp16/bf16 overflow in the eval's larger batches or longer
        sequences, an eval set whose labels are all masked (a mean over no tokens is 0/0), or weights
        that only the eval's inputs push out of range. The eval loss (and every choice made on it: the
        best checkpoint, early stopping) means nothing from there. An RL or preference run's evaluation
        is its objective's rule to tell (detect/objective.py), with the objective's own eval fields.
        """
        if point.objective not in (None, LOSS_OBJECTIVE):
            return
        on = self.rep.is_on("nan_eval", self.metric)
        if math.isfinite(value):
            if on:
                self.rep.report(out, "nan_eval", self.metric, point.rec.step, False)
            return
        train = point.rec.loss
        held = "while the training loss is finite" if train is not None and math.isfinite(train) else ""
        cause = (
            f"the eval loss is {value} {held}: the model's outputs on some eval sample are NaN/Inf "
            "(fp16 overflow on the eval's longer or larger batches, an eval set whose labels are all "
            "masked, weights the eval's inputs push out of range); the best checkpoint and early "
            "stopping are judged on a meaningless number from here"
        ).replace("  ", " ")
        ev = None if on else {"field": self.metric, "value": str(value), "loss": rounded(train)}
        self.rep.report(out, "nan_eval", self.metric, point.rec.step, True, evidence=ev, cause=cause)

    def _rise_needed(self) -> float:
        """How far (log) above its best an evaluation must be: ``rise``, or 4.5 of the evaluations' noise.

        The best evaluation is the luckiest one: over a few dozen evaluations of a flat eval loss it sits
        about two of their noise below the rest, so two in a row ``rise`` (3%) above it are chance once
        the noise is 1% (a small eval set); at 4 noise units still one flat run of 100 in generated coarse
        logs, at 5 a 10% creep over ten evaluations at 1% noise is missed. The noise is read from second
        differences, which a steady fall or climb does not enter; from three of them (five evaluations) on.
        """
        if len(self._curv) < 3:
            return self.lim.rise
        ordered = self._curv
        mid = len(ordered) // 2
        med = ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])
        sigma = med / (0.6745 * math.sqrt(6.0))  # median |N(0, 6σ²)|: y[i] - 2y[i-1] + y[i-2]
        return max(self.lim.rise, _EVAL_NOISE_UNITS * sigma)
