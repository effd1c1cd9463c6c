"""What a run optimises, named from the fields it logs or the trainer class that runs it. Pure.

Shared by the detectors (which rules judge a run) and the guard inside a trainer (which names
its objective on its first record), so it sits on the ground floor with no imports of its own:
the guard must run in a tool's venv that has nothing but torch and transformers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

# Fields that only RL / preference trainers log (TRL, OpenRLHF, verl, LLaMA-Factory), also under a
# prefix a script or logger puts before them: ``eval_reward``, ``train_reward``, ``mean_reward``,
# ``average_reward_score`` (DeepSpeed-Chat), ``kl_ref``, ``reference_kl``, ``chosen_logps``.
_MARKER = re.compile(
    r"(^|[/_])(rewards?|kl|reward_std|rewards/(chosen|rejected|margins|accuracies)|logps|logits/(chosen|rejected))"
    r"($|/|_)",
    re.IGNORECASE,
)
# A loss named after its objective (MiniMind's ``dpo_loss``, a script's ``grpo_loss`` or ``loss/orpo``).
_NAMED_LOSS = re.compile(
    r"(?:^|[/_])(?P<name>dpo|ipo|kto|orpo|simpo|cpo|grpo|rloo|dapo|ppo)[/_]loss$|(?:^|[/_])loss[/_]"
    r"(?P<after>dpo|ipo|kto|orpo|simpo|cpo|grpo|rloo|dapo|ppo)$",
    re.IGNORECASE,
)
_NAMED = {
    "dpo": "preference (DPO)",
    "ipo": "preference (DPO)",
    "simpo": "preference (DPO)",
    "kto": "preference (KTO)",
    "orpo": "preference (ORPO)",
    "cpo": "preference (CPO)",
    "grpo": "RL (GRPO/RLOO)",
    "rloo": "RL (GRPO/RLOO)",
    "dapo": "RL (GRPO/RLOO)",
    "ppo": "RL (PPO)",
}
# What a run judged by the SFT loss rules is called (SFT, continued pretraining, a reward model).
LOSS_OBJECTIVE = "loss (SFT, pretraining)"
# What a run is judged as once its loss goes below zero, which no cross-entropy does: a policy-gradient,
# preference or distillation objective, negative, near zero or flat by construction (never a collapse).
SIGNED_OBJECTIVE = "a loss that goes negative (policy gradient, preference or distillation)"
# Which trainer wrote them, by the fields only it logs, most specific first: GRPO and KTO both log a
# ``kl``, KTO and DPO both log ``rewards/chosen``. Each entry: a name, and sets of fields any one of
# which (all its fields present) names it. RLOO logs what GRPO logs.
_FAMILIES: tuple[tuple[str, tuple[frozenset[str], ...]], ...] = (
    ("preference (ORPO)", (frozenset({"log_odds_ratio"}), frozenset({"log_odds_chosen"}))),
    ("RL (PPO)", (frozenset({"objective/kl"}), frozenset({"objective/scores"}))),
    # verl's actor logs its policy-gradient loss and clip fraction under ``actor/``, whatever the
    # advantage estimator (PPO with a critic, GRPO, RLOO, ...): the trainer is named, not the algorithm.
    ("RL (verl)", (frozenset({"actor/pg_loss"}), frozenset({"actor/pg_clipfrac"}))),
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
    if not extra:
        return None
    named = next((m for k in extra if (m := _NAMED_LOSS.search(k))), None)
    if not named and not any(_MARKER.search(k) for k in extra):
        return None
    for name, signs in _FAMILIES:
        if any(sign.issubset(extra) for sign in signs):
            return name
    if named:
        return _NAMED[(named.group("name") or named.group("after")).lower()]
    return "RL or preference"


def is_preference_or_rl(extra: Mapping[str, Any] | None) -> bool:
    """True when a record's fields say it comes from an RL or preference objective."""
    return objective_of(extra) is not None


def is_rl(objective: str | None) -> bool:
    """Whether an objective's name (as :func:`objective_of` gives it) is an RL one, whose batches may
    carry no learning signal (:func:`without_learning_signal`)."""
    return objective is not None and objective.startswith("RL")


# The names a logged reward goes by, the first found the one read (the detectors' and the rollout
# batches' alike).
REWARD_KEYS = (
    "reward",
    "rewards/margins",
    "objective/scores",
    "env/reward_mean",
    "rewards",
    "critic/score/mean",  # verl: the task's score, before any KL penalty
    "critic/rewards/mean",
    "reward_mean",
    "mean_reward",
    "reward/mean",
    "avg_reward",
    "rewards/chosen",
)


def first(extra: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[str, float] | None:
    """The first of ``keys`` that ``extra`` holds as a finite number: (key, value)."""
    for k in keys:
        v = extra.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return k, float(v)
    return None


# A group-relative trainer (GRPO, RLOO, DAPO) learns from the reward differences inside each group of
# completions; a batch in which every group's rewards tie has zero advantages, and its gradient is
# the KL term's alone (exactly zero at beta 0). The fields that say so: the share of groups without
# spread (TRL's ``frac_reward_zero_std``), no spread in the batch (TRL's ``reward_std``, the mean of
# the groups' spreads, at 0), a highest reward equal to the lowest, or an advantage range of zero
# (verl's ``critic/advantages/max`` and ``/min``).
_ADVANTAGE_RANGE = ("critic/advantages/max", "critic/advantages/min")
_REWARD_RANGES = (
    ("critic/score/max", "critic/score/min"),
    ("critic/rewards/max", "critic/rewards/min"),
    ("reward_max", "reward_min"),
    ("max_reward", "min_reward"),
    ("reward/max", "reward/min"),
)

# Every field :func:`tied_share` reads: what tells one rollout batch's spread from another's.
TIE_KEYS: tuple[str, ...] = (
    "frac_reward_zero_std",
    "reward_std",
    *_ADVANTAGE_RANGE,
    *(k for pair in _REWARD_RANGES for k in pair),
)


def _number(extra: Mapping[str, Any], key: str) -> float | None:
    v = extra.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def tied_share(extra: Mapping[str, Any] | None) -> float | None:
    """The share of an RL batch's prompt groups whose completions all earned the same reward (0 to 1):
    TRL's ``frac_reward_zero_std``, or 1 when the batch has no spread at all; None when the record
    cannot say (a batch with some spread may still tie within every group)."""
    if not extra:
        return None
    share = _number(extra, "frac_reward_zero_std")
    if share is not None:
        return min(max(share, 0.0), 1.0)
    if _number(extra, "reward_std") == 0.0:
        return 1.0
    if all(_number(extra, k) == 0.0 for k in _ADVANTAGE_RANGE):
        return 1.0
    for high, low in _REWARD_RANGES:
        hi, lo = _number(extra, high), _number(extra, low)
        if hi is not None and lo is not None:
            return 1.0 if hi == lo else None
    return None


def without_learning_signal(extra: Mapping[str, Any] | None, grad_norm: float | None = None) -> bool:
    """True when an RL record's batch carried no reward signal, so its gradient norm says nothing
    about the update rule's health: every group's rewards tied, or (no field to tell) a norm of
    exactly zero, which only a batch without advantages gives in a run that was learning."""
    share = tied_share(extra)
    return (share is not None and share >= 1.0) or grad_norm == 0.0
