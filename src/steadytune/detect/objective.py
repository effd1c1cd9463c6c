"""Objective-aware judging: RL and preference runs are not read with the SFT loss rules.

GRPO, PPO, DPO, ORPO and KTO losses sit near zero or below it by design, and a DPO
loss that falls from ln 2 towards zero is the objective working, not a collapse.
Such runs are known by what they log (a ``reward``, a ``kl``, ``rewards/chosen``,
``logps/rejected``, ...). For them the loss is still checked for NaN/Inf, the
gradient norm keeps its own rules, and two signals of their own are judged:

- **reward_collapse**: the reward level (median of the last points) gave back all it
  had gained since the start, after gaining clearly more than its noise;
- **kl_blowup**: the KL to the reference jumped ``kl_jump_ratio`` times above its
  recent level in log space, with the same young-baseline care as a grad spike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from steadytune.detect.base import Finding, KindInfo, Reporter, rounded
from steadytune.detect.points import Signal
from steadytune.detect.stats import Tracker
from steadytune.objectives import LOSS_OBJECTIVE

KINDS: dict[str, KindInfo] = {
    "reward_collapse": KindInfo(
        "reward collapsed",
        "an RL or preference run gave back everything its reward had gained: the policy drifted into "
        "degenerate outputs (reward hacking undone, a too-high LR, or a too-small KL penalty)",
        "roll back to the checkpoint at the best reward, lower the LR, raise the KL coefficient (beta)",
        "warning",
    ),
    "kl_blowup": KindInfo(
        "KL divergence blew up",
        "the policy jumped away from the reference model in a few steps: an unstable update, a too-high "
        "LR or a too-small KL penalty",
        "lower the LR, raise beta, clip gradients; roll back if the reward falls with it",
        "warning",
    ),
}

_REWARD_KEYS = (
    "reward",
    "rewards/margins",
    "rewards/chosen",
    "objective/scores",
    "env/reward_mean",
    "rewards",
    "critic/score/mean",  # verl: the task's score, before any KL penalty
    "critic/rewards/mean",
)
_KL_KEYS = ("kl", "objective/kl", "train/kl", "policy/kl", "actor/kl_loss", "critic/kl")
_MIN_GAIN_SIGMAS = 4.0


def _first(extra: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[str, float] | None:
    for k in keys:
        v = extra.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return k, float(v)
    return None


@dataclass(frozen=True, slots=True)
class ObjectiveLimits:
    """As ``detect.loss`` and ``detect.series`` name them (docs/detectors.md)."""

    level_window: int
    noise_window: int
    gap_factor: float
    spike_z: float
    divergence_points: int
    kl_jump_ratio: float


class ObjectiveWatch:
    """reward_collapse and kl_blowup of an RL or preference run."""

    reports: ClassVar[tuple[str, ...]] = tuple(KINDS)

    def __init__(self, limits: ObjectiveLimits, rank: int | None = None) -> None:
        self.rep = Reporter(rank)
        self.lim = limits
        self.reward = Tracker(limits.level_window, limits.noise_window, 1.0, 0.0, 1e-6)
        self.kl = Tracker(limits.level_window, limits.noise_window, 0.5, 2.0, 0.05)
        self._initial: float | None = None
        self._best: float | None = None
        self._low = 0
        self._kl_jump = math.log(limits.kl_jump_ratio)

    def observe(self, point: Signal, out: list[Finding]) -> None:
        """An RL or preference run's reward and KL; a run judged by the SFT loss has none to judge."""
        if point.objective not in (None, LOSS_OBJECTIVE) and point.rec.extra:
            self.judge(point.rec.step, point.rec.extra, out)

    def judge(self, step: int, extra: Mapping[str, Any], out: list[Finding]) -> None:
        r = _first(extra, _REWARD_KEYS)
        if r is not None:
            self._reward(step, r[0], r[1], out)
        k = _first(extra, _KL_KEYS)
        if k is not None and k[1] > 0:
            self._kl(step, k[0], k[1], out)

    def _reward(self, step: int, key: str, value: float, out: list[Finding]) -> None:
        t = self.reward
        t.begin(step, self.lim.gap_factor)
        t.accept(value)  # rewards are not log-scaled: they may be negative
        if not t.level_full:
            return
        level = t.level
        if self._initial is None:
            self._initial = self._best = level
            return
        self._best = max(self._best or level, level)
        gained = self._best - self._initial
        lost_all = gained > _MIN_GAIN_SIGMAS * t.sigma and level <= self._initial
        self._low = self._low + 1 if lost_all else 0
        if self._low >= self.lim.divergence_points:
            ev = None
            if not self.rep.is_on("reward_collapse", key):
                ev = {
                    "level": rounded(level),
                    "best_level": rounded(self._best),
                    "initial_level": rounded(self._initial),
                    "noise_sigma": rounded(t.sigma, 4),
                }
            self.rep.report(out, "reward_collapse", key, step, True, evidence=ev)
        elif self.rep.is_on("reward_collapse", key) and level > self._initial + 0.5 * gained:
            self.rep.report(out, "reward_collapse", key, step, False)

    def _kl(self, step: int, key: str, value: float, out: list[Finding]) -> None:
        t = self.kl
        t.begin(step, self.lim.gap_factor)
        y = math.log(value)
        if t.n_level >= t.level_window:
            jump = y - t.level
            if jump > max(self._kl_jump, t.threshold(self.lim.spike_z)):
                ev = None
                if not self.rep.is_on("kl_blowup", key):
                    ev = {
                        "value": rounded(value),
                        "baseline": rounded(math.exp(t.level)),
                        "ratio": rounded(math.exp(jump), 4),
                        "threshold_ratio": self.lim.kl_jump_ratio,
                    }
                self.rep.report(out, "kl_blowup", key, step, True, evidence=ev)
                return
            if self.rep.is_on("kl_blowup", key) and jump < 0.5 * self._kl_jump:
                self.rep.report(out, "kl_blowup", key, step, False)
        t.accept(y)
