"""Objective-aware judging: RL and preference runs are read on their own signals, not the SFT loss.

GRPO, PPO, DPO, ORPO and KTO losses sit near zero or below it by design, and a DPO
loss that falls from ln 2 towards zero is the objective working, not a collapse.
Such runs are known by what they log (a ``reward``, a ``kl``, ``rewards/chosen``,
``logps/rejected``, ...: :mod:`steadytune.objectives`). For them the loss is only
checked for NaN/Inf, the gradient norm keeps its own rules (gated by the learning
signal, :mod:`.grad`), and their own signals are judged, each by a rule of its own:

- the reward falls and stays down: ``reward_collapse`` (:mod:`.reward`);
- the KL to the reference jumps or runs away: ``kl_blowup`` (:mod:`.kl`);
- most tokens' ratios are clipped: ``clip_saturation`` (:mod:`.kl`);
- no batch carries a learning signal: ``no_learning_signal`` (:mod:`.learning`);
- the objective's own fields turn NaN or Inf while the loss stays finite:
  ``nan_loss`` on that field, here. A DPO trainer computes its rewards and margins
  from the log-probabilities its loss uses: a NaN there is a NaN in the model's
  outputs for some pair, whatever the averaged loss shows.

This module names the fields each rule reads, in the order they are preferred.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from steadytune.detect.base import Finding, Reporter, rounded
from steadytune.detect.points import Signal
from steadytune.objectives import LOSS_OBJECTIVE, REWARD_KEYS

KL_KEYS = (
    "kl",
    "reference_kl",
    "objective/kl",
    "train/kl",
    "policy/kl",
    "actor/kl_loss",
    "critic/kl",
    "kl_divergence",
)
ENTROPY_KEYS = (
    "entropy",
    "token_entropy",
    "objective/entropy",
    "actor/entropy",
    "policy/entropy_avg",
    "avg_entropy",
)
LENGTH_KEYS = (
    "completions/mean_length",
    "completion_length",
    "response_length/mean",
    "response_length_mean",
    "mean_length",
)
CLIP_KEYS = ("clip_ratio/region_mean", "clip_ratio", "policy/clipfrac_avg", "actor/pg_clipfrac", "clipfrac")
# The fields whose NaN is the objective's own: the reward, the preference pairs' rewards and
# log-probabilities, the KL.
_NAN_KEYS = (
    *REWARD_KEYS,
    "rewards/rejected",
    "logps/chosen",
    "logps/rejected",
    *KL_KEYS,
)


@dataclass(frozen=True, slots=True)
class ObjectiveLimits:
    """None yet: a NaN is a NaN at any scale."""


class ObjectiveWatch:
    """nan_loss on an RL or preference run's own fields (the reward, margins, log-probabilities, KL);
    nan_eval on its evaluation's."""

    reports: ClassVar[tuple[str, ...]] = ("nan_loss", "nan_eval")
    needs: ClassVar[tuple[str, ...]] = ("own_objective", "extra")  # see base.Detector

    def __init__(self, limits: ObjectiveLimits | None = None, rank: int | None = None) -> None:
        self.rep = Reporter(rank)

    def observe(self, point: Signal, out: list[Finding]) -> None:
        """The objective's fields of the step; a NaN loss is the loss series' to report."""
        extra, step, loss = point.rec.extra, point.rec.step, point.rec.loss
        if point.objective in (None, LOSS_OBJECTIVE) or not extra:
            return
        finite_loss = loss is None or math.isfinite(loss)
        bad = {}
        if extra.get("eval"):
            # An evaluation's own record: its fields are the eval set's, its loss the eval loss. A NaN there
            # is a NaN in the model's outputs on some eval sample, whatever the training loss shows.
            bad = _nonfinite(extra, _NAN_KEYS, "eval_")
            eval_loss = point.rec.eval_loss
        else:
            if finite_loss:
                bad = _nonfinite(extra, _NAN_KEYS)
            # An evaluation merged into the training step's record (HF's trainer_state, by step): its fields
            # carry the ``eval_`` prefix, its loss is ``eval_loss``.
            bad |= _nonfinite(extra, tuple(f"eval_{k}" for k in _NAN_KEYS))
            eval_loss = point.rec.eval_loss
        if eval_loss is not None and not math.isfinite(eval_loss):
            bad = {"eval_loss": eval_loss, **bad}
        evaluation = bool(extra.get("eval"))
        told: set[tuple[str, str]] = set()
        # The training step's fields and the evaluation's are two troubles: a NaN update spoils the
        # weights (nan_loss, acted on), a NaN on the eval set spoils the judgement of them (nan_eval, told).
        for kind, fields in (
            ("nan_loss", {k: v for k, v in bad.items() if not (evaluation or k.startswith("eval_"))}),
            ("nan_eval", {k: v for k, v in bad.items() if evaluation or k.startswith("eval_")}),
        ):
            if fields:
                told.add((kind, self._report(out, kind, fields, step, loss)))
        for key in [key for key in self.rep.on if key not in told]:
            self.rep.report(out, key[0], key[1], step, False)

    def _report(
        self, out: list[Finding], kind: str, bad: dict[str, float], step: int, loss: float | None
    ) -> str:
        k, v = next(iter(bad.items()))  # the episode is named after the first, in the fields' order
        ev = None
        if not self.rep.is_on(kind, k):
            ev = {"field": k, "value": str(v), "fields": sorted(bad), "loss": rounded(loss)}
        held = "in an evaluation" if kind == "nan_eval" else "while the loss is finite"
        cause = (
            f"the objective's own {', '.join(bad)} {'is' if len(bad) == 1 else 'are'} NaN/Inf {held}: "
            "the model's outputs hold NaN/Inf for some sample (fp16 overflow, a log of zero, a bad "
            "batch) that the averaged loss hides"
        )
        self.rep.report(out, kind, k, step, True, evidence=ev, cause=cause)
        return k


def _nonfinite(extra: Mapping[str, Any], keys: tuple[str, ...], prefix: str = "") -> dict[str, float]:
    """The fields of ``keys`` (also under ``prefix``) that ``extra`` holds as NaN or Inf, in order."""
    out = {}
    for k in keys:
        for name in (k, f"{prefix}{k}") if prefix else (k,):
            v = extra.get(name)
            if isinstance(v, float) and not math.isfinite(v):
                out[name] = v
    return out
