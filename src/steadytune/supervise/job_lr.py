"""Which learning rate a rollback of a supervised command scales.

A rollback restarts the command with its LR argument set to a lower rate, and the
job's schedule (warm-up, decay) then scales that argument again as it would have
scaled its own: so the LR scaled must be the job's *base* LR, never the schedule's
value at the trouble (halving a decayed 0.0008 and passing it as the base ran the
resumed steps at 0.2x, not 0.5x). steadytune learns the base LR four ways, in this
order:

- ``--base-lr``: the user saying it;
- the command's own LR argument (``--learning_rate 2e-3``, ``learning_rate=2e-3``),
  found where the preset's or ``--lr-arg``'s template puts it;
- the highest LR the job logged so far: the peak of a warm-up/decay schedule is
  its base LR, and a constant schedule logs it every step;
- the config's ``train.learning_rate``: steadytune's own config, often copied from an
  example, and may have nothing to do with the job (scaling it by 0.5 once raised a
  job's LR from 2e-05 to 0.001). So a logged LR wins over it, and a config that
  disagrees with the logged peak by more than :data:`DISAGREE` is said.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeGuard

DISAGREE = 2.0  # past this ratio the config's LR is not the job's

# Each source as the rollback's event says it.
SAID = {
    "--base-lr": "--base-lr",
    "command": "the command's {flag}",
    "logged": "the highest LR the job logged",
    "config": "train.learning_rate",
}


@dataclass(frozen=True)
class BaseLr:
    lr: float
    source: str  # a key of SAID
    note: str = ""  # why the config's LR was passed over, when it was
    flag: str = ""  # the command's LR argument, when source is "command"

    def said(self) -> str:
        return SAID[self.source].format(flag=self.flag)


def usable_lr(lr: float | None) -> TypeGuard[float]:
    return lr is not None and math.isfinite(lr) and lr > 0


def lr_flag(lr_arg: str | None) -> str | None:
    """The argument an LR template sets, as written: ``"--learning_rate {lr}"`` gives
    ``--learning_rate``, ``"learning_rate={lr}"`` gives ``learning_rate``; None without ``{lr}``."""
    words = (lr_arg or "").split()
    for i, word in enumerate(words):
        if word == "{lr}":
            return words[i - 1] if i else None
        if "{lr}" in word:
            flag = word.split("=", 1)[0]
            return flag if "=" in word and flag.strip("-") else None
    return None


def choose_base_lr(
    explicit: float | None,
    command: tuple[float, str] | None,
    logged_peak: float | None,
    configured: float | None,
) -> BaseLr | None:
    """The LR a rollback scales: ``--base-lr``, the command's LR argument, the highest LR the job
    logged, the config's; None when none is known."""
    if usable_lr(explicit):
        return BaseLr(explicit, "--base-lr")
    if command is not None and usable_lr(command[0]):
        return BaseLr(command[0], "command", flag=command[1])
    if usable_lr(logged_peak):
        if not usable_lr(configured):
            return BaseLr(logged_peak, "logged")
        ratio = max(configured / logged_peak, logged_peak / configured)
        note = (
            f"the config's train.learning_rate {configured:g} is {ratio:.3g}x the highest LR the job "
            f"logged ({logged_peak:g}): it is not the job's, so the rollback scales the logged one "
            "(--base-lr chooses another)"
            if ratio > DISAGREE
            else ""
        )
        return BaseLr(logged_peak, "logged", note)
    if usable_lr(configured):
        return BaseLr(configured, "config")
    return None
