"""kl_blowup: the KL to the reference model jumps, or runs away while the reward does not improve.

The KL term keeps an RL or preference policy near its reference; how far it strays is
the run's stability in one number. Two ways it goes wrong:

- a **jump**: one update throws the policy far off (an LR burst, a bad batch): the KL
  ``rl.kl_jump_ratio`` (10x) its recent level in log space, and ``loss.spike_z``
  noise sigmas. Jumped points stay out of the level, so a KL that stays up stays
  judged against where it was. While the level is **young** (under
  ``series.level_window``, 8, points) it is the median of the few points so far, with the
  noise shrunk towards the prior and taken one standard error up, as the loss and gradient
  series judge a young level (:class:`~.stats.Tracker`), from a run's (or a snippet's)
  third point on. But a **fresh policy**'s KL climbs from 0 by design: its first points may
  grow a thousandfold (1e-5 to 0.01 in one step, healthy), so a per-token KL whose young
  level is under ``rl.kl_runaway_min`` (0.1, where a KL has run nowhere) is judged against
  that prior instead, from the second point: ``rl.kl_jump_ratio`` over it (1 nat per token)
  is a jump, told at its point, where a fresh policy shows 1e-4 to 0.05. A young per-token
  level above the prior keeps a bar no higher than the prior noise gives (:meth:`KLWatch._yardstick`);
- a **runaway**: the KL climbs step after step, each step too small to be a jump,
  while the reward buys nothing with it. Its level (median of 8) ``rl.kl_runaway_ratio``
  (100x, the labelling guide's "x100 and more") above where it stood when the reward
  last made a new best, or, before the reward ever did (or where no reward is
  logged), where it stood two level windows into the run: its first points climb from
  0 by design (the policy starts as its reference), so they are no yardstick. A KL
  that grows as the reward rises is the policy learning, and moves the yardstick up.
  And the level must reach ``rl.kl_runaway_min`` (0.1): a KL that climbs from 2e-5 to
  0.003 while a noisy reward rises too slowly to show it has run nowhere (a healthy
  GRPO run of one group a step did that).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from steadytune.detect.base import Finding, KindInfo, Reporter, rounded
from steadytune.detect.objective import KL_KEYS
from steadytune.detect.points import Signal
from steadytune.detect.stats import Tracker
from steadytune.objectives import LOSS_OBJECTIVE, first

_NOISE_PRIOR = 0.5  # log KL per point: a KL estimate from one batch moves by tens of percent
# One point is too young a baseline (as for the gradient norm): a first KL of 1e-6 (the reference's
# rounding) and a second of 5 may be a burst, or a KL summed over a sequence leaving 0.
_MIN_BASELINE = 2

KINDS: dict[str, KindInfo] = {
    "kl_blowup": KindInfo(
        "KL divergence blew up",
        "the policy moved far from the reference model: an unstable update, a too-high LR or a too-small "
        "KL penalty",
        "roll back to the last good checkpoint with a lower LR, raise beta, clip gradients",
        "warning",
        after={"rollback": "raise beta and clip gradients if it comes back"},
    ),
}


@dataclass(frozen=True, slots=True)
class KLLimits:
    """As ``detect.series``, ``detect.loss`` and ``detect.rl`` name them (docs/detectors.md)."""

    level_window: int
    noise_window: int
    gap_factor: float
    spike_z: float
    kl_jump_ratio: float
    kl_runaway_ratio: float
    kl_runaway_min: float


class KLWatch:
    """kl_blowup of an RL or preference run: a jump, or a runaway the reward does not pay for."""

    reports: ClassVar[tuple[str, ...]] = tuple(KINDS)
    needs: ClassVar[tuple[str, ...]] = ("own_objective", "extra")  # see base.Detector

    def __init__(
        self,
        limits: KLLimits,
        reward_improved: Callable[[], int | None] | None = None,
        rank: int | None = None,
    ) -> None:
        self.rep = Reporter(rank)
        self.lim = limits
        self.t = Tracker(limits.level_window, limits.noise_window, _NOISE_PRIOR, 2.0, 0.05)
        self._jump = math.log(limits.kl_jump_ratio)
        self._runaway = math.log(limits.kl_runaway_ratio)
        # 0 turns the fresh policy's prior off: every young level is then the run's own.
        self._fresh = math.log(limits.kl_runaway_min) if limits.kl_runaway_min > 0 else -math.inf
        self._improved = reward_improved or (lambda: None)
        self._seen_improved: int | None = None
        self._ref: tuple[int, float] | None = None  # (step, log level) the runaway is measured from
        self._n = 0
        self._jumping = False

    def observe(self, point: Signal, out: list[Finding]) -> None:
        """The step's KL, on an RL or preference run."""
        extra = point.rec.extra
        if point.objective in (None, LOSS_OBJECTIVE) or not extra or extra.get("eval"):
            return
        k = first(extra, KL_KEYS)
        if k is not None and k[1] > 0:
            self.judge(point.rec.step, k[0], k[1], out, per_token(point.objective, k[0]))

    def judge(self, step: int, key: str, value: float, out: list[Finding], fresh_prior: bool = True) -> None:
        """Judge one positive KL; ``fresh_prior``: it is a mean per token, which a fresh policy keeps
        under ``rl.kl_runaway_min`` (:func:`per_token`)."""
        t = self.t
        if t.begin(step, self.lim.gap_factor):
            self._ref, self._n = None, 0  # a gap or a restart: the yardstick starts again
        y = math.log(value)
        ev: dict[str, Any] | None = None
        judged = self._yardstick(fresh_prior)
        if judged is not None:
            base, need, fresh = judged
            jump = y - base
            if jump > need:
                self._jumping = True
                if not self.rep.is_on("kl_blowup", key):
                    ev = {
                        "value": rounded(value),
                        "baseline": rounded(math.exp(base)),
                        "ratio": rounded(math.exp(jump), 4),
                        "threshold_ratio": rounded(math.exp(need), 4),
                    }
                    if fresh:
                        ev["judged_by"] = "fresh policy"
                        ev["level"] = rounded(math.exp(t.level))
                        ev["points"] = t.n_level
                self.rep.report(out, "kl_blowup", key, step, True, evidence=ev)
                return
            self._jumping = self._jumping and jump >= 0.5 * self._jump
        t.accept(y)
        self._n += 1
        running = self._runaway_now(step, value)
        if running is not None and not self.rep.is_on("kl_blowup", key):
            ev = running
        if running is not None or self._jumping:
            self.rep.report(out, "kl_blowup", key, step, True, evidence=ev)
        elif self.rep.is_on("kl_blowup", key):
            self.rep.report(out, "kl_blowup", key, step, False)

    def _yardstick(self, fresh_prior: bool) -> tuple[float, float, bool] | None:
        """The log level a KL is judged against, how far above it a jump lies, and whether that
        level is the fresh policy's prior rather than the run's own; None while nothing judges it.

        A young level under the prior is no yardstick: the prior is, and ``kl_jump_ratio`` over
        it is the bar. The prior is a ceiling of what a healthy fresh policy shows, not a level
        measured with noise, so neither the noise of the few points under it (a climb from 0 by
        orders of magnitude) nor their number widens the bar.
        """
        t = self.t
        young = t.n_level < t.level_window
        if fresh_prior and young and t.n_level > 0 and t.level < self._fresh:
            return self._fresh, self._jump, True
        if t.n_level < _MIN_BASELINE:
            return None
        need = t.threshold(self.lim.spike_z)
        if fresh_prior and young:
            # A per-token KL's noise is known well enough: a few differences taken one standard
            # error up (130,000x at the third point) do not raise the bar past the prior noise's.
            need = min(need, self.lim.spike_z * _NOISE_PRIOR * math.sqrt(1.0 + 1.0 / t.n_level))
        return t.level, max(self._jump, need), False

    def _runaway_now(self, step: int, value: float) -> dict[str, Any] | None:
        """The runaway's evidence while the level stands ``kl_runaway_ratio`` above its yardstick."""
        t = self.t
        if self._n < 2 * t.level_window:
            return None
        improved = self._improved()
        if self._ref is None or improved != self._seen_improved:
            self._seen_improved = improved
            self._ref = (step, t.level)
            return None
        ref_step, ref = self._ref
        rise = t.level - ref
        if rise < self._runaway or math.exp(t.level) < self.lim.kl_runaway_min:
            return None
        return {
            "value": rounded(value),
            "level": rounded(math.exp(t.level)),
            "reference": rounded(math.exp(ref)),
            "reference_step": ref_step,
            "ratio": rounded(math.exp(rise), 4),
            "threshold_ratio": self.lim.kl_runaway_ratio,
            "since_step": ref_step,
            "reason": "the KL ran away while the reward did not improve",
        }


def per_token(objective: str | None, key: str) -> bool:
    """Whether a run's KL is a mean per token, the scale ``rl.kl_runaway_min`` speaks in.

    Not TRL's PPO ``objective/kl`` (summed over each completion: a healthy run's is 2 to 20 from
    its first step), nor a preference run's (KTO's ``kl`` compares whole sequences): their first
    points are judged against their own level only.
    """
    if key == "objective/kl" or objective is None:
        return False
    return not objective.startswith(("preference", "RL (PPO)"))
