"""clip_saturation: most of a PPO-style update is clipped away.

PPO, GRPO with several iterations per batch, and their kin clip each token's
probability ratio to ``1 ± ε``: a token whose ratio left that range gives no gradient
(its advantage pushes no further). A small share of clipped tokens is the clip doing
its job; when the share's level (median of the last ``series.level_window`` points)
reaches ``rl.clip_saturation`` (0.3), a third of the tokens move further per update
than the clipping allows: the steps are too large for the data (a too-high LR, too
many epochs or iterations on the same rollouts, rollouts too far off-policy), and the
update learns from the few tokens left. Practitioners read a clip fraction of 0.1-0.2
as busy and above 0.3 as too much; an on-policy run with one iteration clips nothing.
It clears once the level falls below half of that.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import ClassVar

from steadytune.detect.base import Finding, KindInfo, Reporter, rounded
from steadytune.detect.objective import CLIP_KEYS
from steadytune.detect.points import Signal
from steadytune.objectives import LOSS_OBJECTIVE, first

KINDS: dict[str, KindInfo] = {
    "clip_saturation": KindInfo(
        "clip ratio saturated",
        "most tokens' probability ratios left the clip range: each update moves the policy further than "
        "the clipping allows, and the clipped tokens give no gradient (a too-high LR, too many epochs or "
        "iterations on the same rollouts, rollouts too far off-policy)",
        "lower the LR, use fewer PPO epochs or num_iterations, refresh the rollouts more often; watch the KL",
        "warning",
    ),
}


@dataclass(frozen=True, slots=True)
class ClipLimits:
    """As ``detect.series`` and ``detect.rl`` name them (docs/detectors.md)."""

    level_window: int
    clip_saturation: float


class ClipWatch:
    """clip_saturation: the clipped share's level at ``clip_saturation`` or above."""

    reports: ClassVar[tuple[str, ...]] = tuple(KINDS)
    needs: ClassVar[tuple[str, ...]] = ("own_objective", "extra")  # see base.Detector

    def __init__(self, limits: ClipLimits, rank: int | None = None) -> None:
        self.lim = limits
        self.rep = Reporter(rank)
        self._values: deque[float] = deque(maxlen=limits.level_window)

    def observe(self, point: Signal, out: list[Finding]) -> None:
        extra = point.rec.extra
        if point.objective in (None, LOSS_OBJECTIVE) or not extra or extra.get("eval"):
            return
        c = first(extra, CLIP_KEYS)
        if c is None:
            return
        key, value = c
        self._values.append(value)
        if len(self._values) < self._values.maxlen:  # type: ignore[operator]
            return
        ordered = sorted(self._values)
        level = ordered[len(ordered) // 2]
        on = self.rep.is_on("clip_saturation", key)
        if level >= self.lim.clip_saturation:
            ev = None if on else {"level": rounded(level, 4), "threshold": self.lim.clip_saturation}
            self.rep.report(out, "clip_saturation", key, point.rec.step, True, evidence=ev)
        elif on and level < self.lim.clip_saturation / 2:
            self.rep.report(out, "clip_saturation", key, point.rec.step, False)
        elif on:
            self.rep.report(out, "clip_saturation", key, point.rec.step, True)
