"""How often to checkpoint, from what saving costs and how often the run is interrupted.

Young (1974) and Daly (2006): with a save that stalls training for ``C`` seconds and an
interruption every ``M`` seconds on average, saving every ``τ`` seconds of training loses
about ``C/τ`` of the time to saves and ``τ/2M`` to work redone after an interruption (on
average half an interval). The sum is least at ``τ ≈ √(2·C·M)``; Daly's higher-order
form, used here, stays right when ``C`` is not small against ``M``. Pure: numbers in,
advice out.

When no interruption has been seen, ``M`` is only known to be longer than the time watched:
the optimum is then at least the interval computed with that time, so the advice can say
"save less often" but never "save more often".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Worth saying when the current interval loses this much more of the time than the optimum...
MIN_GAIN = 0.005
# ... and this many times the optimum's loss.
MIN_RATIO = 1.25


def daly_interval(save_s: float, mtbf_s: float) -> float:
    """Daly's optimum checkpoint interval (seconds of work between saves) for save cost and MTBF."""
    if save_s <= 0:
        return 0.0
    if save_s >= 2 * mtbf_s:
        return mtbf_s
    x = math.sqrt(save_s / (2 * mtbf_s))
    return math.sqrt(2 * save_s * mtbf_s) * (1 + x / 3 + x * x / 9) - save_s


def lost_share(interval_s: float, save_s: float, mtbf_s: float) -> float:
    """The share of time a save every ``interval_s`` seconds loses to saves and redone work."""
    if interval_s <= 0:
        return 1.0
    return save_s / (interval_s + save_s) + (interval_s + save_s) / (2 * mtbf_s)


@dataclass(frozen=True)
class IntervalAdvice:
    """The checkpoint interval the measurements call for, beside the current one."""

    save_cost_s: float
    mtbf_s: float
    mtbf_is_bound: bool  # no interruption seen: the MTBF is longer than this
    step_s: float
    current_steps: int
    best_steps: int
    current_loss: float
    best_loss: float

    @property
    def worth_saying(self) -> bool:
        """The current interval loses noticeably more than the optimum (and the data can tell)."""
        if self.mtbf_is_bound and self.current_steps > self.best_steps:
            return False  # the optimum may be longer still: "save more often" cannot be claimed
        gain = self.current_loss - self.best_loss
        return gain >= MIN_GAIN and self.current_loss >= MIN_RATIO * self.best_loss

    def line(self) -> str:
        """One sentence: what was measured, the optimum, and what each interval costs."""
        every = (
            f"{'no interruption in' if self.mtbf_is_bound else 'an interruption every'} {_dur(self.mtbf_s)}"
        )
        at_least = "at least " if self.mtbf_is_bound else ""
        best = _dur(self.best_steps * self.step_s)
        return (
            f"each save stalls training {self.save_cost_s:.1f} s and {every}: Young/Daly puts the "
            f"checkpoint interval at {at_least}{self.best_steps} steps ({best}); "
            f"save_steps {self.current_steps} loses {100 * self.current_loss:.1f} % of the time to saves "
            f"and redone work, {self.best_steps} would lose {100 * self.best_loss:.1f} %"
        )


def _dur(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def advise(
    save_cost_s: float | None,
    step_s: float | None,
    interruptions: int,
    exposure_s: float,
    save_steps: int,
    max_steps: int | None = None,
) -> IntervalAdvice | None:
    """The interval for a save costing ``save_cost_s`` and ``interruptions`` in ``exposure_s`` seconds.

    Args:
        save_cost_s: the mean time the loop waited for one checkpoint (None: none measured).
        step_s: the time of one optimizer step.
        interruptions: restarts and rollbacks seen in ``exposure_s``.
        exposure_s: the time watched (the runs' wall time, less queue and preflight).
        save_steps: the current interval, in steps.
        max_steps: the run's length, which bounds the interval (a longer one is the final save).

    Returns:
        The advice, or None when a save or a step was never measured.
    """
    if not save_cost_s or not step_s or exposure_s <= 0 or save_steps < 1:
        return None
    bound = interruptions == 0
    mtbf = exposure_s / max(1, interruptions)
    best_s = max(daly_interval(save_cost_s, mtbf), step_s)
    best = max(1, round(best_s / step_s))
    if max_steps and max_steps > 0:
        best = min(best, max_steps)
    return IntervalAdvice(
        save_cost_s=save_cost_s,
        mtbf_s=mtbf,
        mtbf_is_bound=bound,
        step_s=step_s,
        current_steps=save_steps,
        best_steps=best,
        current_loss=lost_share(save_steps * step_s, save_cost_s, mtbf),
        best_loss=lost_share(best * step_s, save_cost_s, mtbf),
    )
