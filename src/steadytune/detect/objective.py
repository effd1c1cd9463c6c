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
import re
from collections.abc import Iterable, Mapping
from typing import Any

from steadytune.detect.base import Finding, Reporter, rounded
from steadytune.detect.stats import Tracker

# Fields that only RL / preference trainers log (TRL, OpenRLHF, verl, LLaMA-Factory).
_MARKER = re.compile(
    r"(^|/)(rewards?|kl|reward_std|rewards/(chosen|rejected|margins|accuracies)|logps|logits/(chosen|rejected))"
    r"($|/|_)",
    re.IGNORECASE,
)
_REWARD_KEYS = (
    "reward",
    "rewards/margins",
    "rewards/chosen",
    "objective/scores",
    "env/reward_mean",
    "rewards",
)
_KL_KEYS = ("kl", "objective/kl", "train/kl", "policy/kl", "actor/kl_loss")
_MIN_GAIN_SIGMAS = 4.0

# What a run judged by the SFT loss rules is called (SFT, continued pretraining, a reward model).
LOSS_OBJECTIVE = "loss (SFT, pretraining)"
# Which trainer wrote them, by the fields only it logs, most specific first: GRPO and KTO both log a
# ``kl``, KTO and DPO both log ``rewards/chosen``. Each entry: a name, and sets of fields any one of
# which (all its fields present) names it. RLOO logs what GRPO logs.
_FAMILIES: tuple[tuple[str, tuple[frozenset[str], ...]], ...] = (
    ("preference (ORPO)", (frozenset({"log_odds_ratio"}), frozenset({"log_odds_chosen"}))),
    ("RL (PPO)", (frozenset({"objective/kl"}), frozenset({"objective/scores"}))),
    ("RL (GRPO/RLOO)", (frozenset({"reward", "reward_std"}), frozenset({"frac_reward_zero_std"}))),
    ("preference (KTO)", (frozenset({"kl", "rewards/chosen"}), frozenset({"kl", "logps/chosen"}))),
    (
        "preference (DPO)",
        (frozenset({"rewards/chosen"}), frozenset({"rewards/margins"}), frozenset({"logps/chosen"})),
    ),
)


# A record may say what it optimises under this key (the guard inside a TRL trainer, whose per-step
# records carry none of the fields the trainer logs later): that comes before the fields.
OBJECTIVE_KEY = "objective"
# TRL's trainer classes by what they optimise; their subclasses (LLaMA-Factory's) inherit the name.
_TRAINERS = {
    "DPOTrainer": "preference (DPO)",
    "KTOTrainer": "preference (KTO)",
    "ORPOTrainer": "preference (ORPO)",
    "CPOTrainer": "preference (CPO)",
    "GRPOTrainer": "RL (GRPO/RLOO)",
    "RLOOTrainer": "RL (GRPO/RLOO)",
    "PPOTrainer": "RL (PPO)",
    "OnlineDPOTrainer": "RL (online DPO)",
}


def objective_of_trainer(class_names: Iterable[str]) -> str | None:
    """The objective of a trainer from its class's MRO names, most derived first; None when no known
    RL or preference trainer is among them (an SFT or plain HF Trainer)."""
    return next((_TRAINERS[n] for n in class_names if n in _TRAINERS), None)


def objective_of(extra: Mapping[str, Any] | None) -> str | None:
    """The RL or preference objective a record names: the one it declares under :data:`OBJECTIVE_KEY`,
    else the one its fields name ("preference (DPO)", "RL (GRPO/RLOO)", and "RL or preference" when
    they mark one but no trainer in particular); None for none."""
    declared = extra.get(OBJECTIVE_KEY) if extra else None
    if isinstance(declared, str) and declared:
        return declared
    if not extra or not any(_MARKER.search(k) for k in extra):
        return None
    for name, signs in _FAMILIES:
        if any(sign.issubset(extra) for sign in signs):
            return name
    return "RL or preference"


def is_preference_or_rl(extra: Mapping[str, Any] | None) -> bool:
    """True when a record's fields say it comes from an RL or preference objective."""
    return objective_of(extra) is not None


def _first(extra: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[str, float] | None:
    for k in keys:
        v = extra.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return k, float(v)
    return None


class ObjectiveWatch:
    """reward_collapse and kl_blowup of an RL or preference run."""

    def __init__(
        self,
        *,
        level_window: int,
        noise_window: int,
        gap_factor: float,
        spike_z: float,
        divergence_points: int,
        kl_jump_ratio: float,
        rank: int | None = None,
    ) -> None:
        """Thresholds as ``detect.loss`` and ``detect.series`` name them (docs/detectors.md)."""
        self.rep = Reporter(rank)
        self.reward = Tracker(level_window, noise_window, 1.0, 0.0, 1e-6)
        self.kl = Tracker(level_window, noise_window, 0.5, 2.0, 0.05)
        self._gap_factor = gap_factor
        self._spike_z = spike_z
        self._divergence_points = divergence_points
        self._kl_jump_ratio = kl_jump_ratio
        self._initial: float | None = None
        self._best: float | None = None
        self._low = 0
        self._kl_jump = math.log(kl_jump_ratio)

    def observe(self, step: int, extra: Mapping[str, Any], out: list[Finding]) -> None:
        r = _first(extra, _REWARD_KEYS)
        if r is not None:
            self._reward(step, r[0], r[1], out)
        k = _first(extra, _KL_KEYS)
        if k is not None and k[1] > 0:
            self._kl(step, k[0], k[1], out)

    def _reward(self, step: int, key: str, value: float, out: list[Finding]) -> None:
        t = self.reward
        t.begin(step, self._gap_factor)
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
        if self._low >= self._divergence_points:
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
        t.begin(step, self._gap_factor)
        y = math.log(value)
        if t.n_level >= t.level_window:
            jump = y - t.level
            if jump > max(self._kl_jump, t.threshold(self._spike_z)):
                ev = None
                if not self.rep.is_on("kl_blowup", key):
                    ev = {
                        "value": rounded(value),
                        "baseline": rounded(math.exp(t.level)),
                        "ratio": rounded(math.exp(jump), 4),
                        "threshold_ratio": self._kl_jump_ratio,
                    }
                self.rep.report(out, "kl_blowup", key, step, True, evidence=ev)
                return
            if self.rep.is_on("kl_blowup", key) and jump < 0.5 * self._kl_jump:
                self.rep.report(out, "kl_blowup", key, step, False)
        t.accept(y)
