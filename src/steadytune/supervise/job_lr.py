"""Which learning rate a rollback of a supervised command scales.

The command sets its own LR; steadytune learns it three ways. ``--base-lr`` is the
user saying it, and wins. The LR the job logs (its schedule's value at the last
logged step) is what it actually ran at. The config's ``train.learning_rate`` is
steadytune's own config, often copied from an example, and may have nothing to do
with the job: scaling it by 0.5 once raised a job's LR from 2e-05 to 0.001. So the
logged LR wins over the config's, and a config that disagrees with it by more than
:data:`DISAGREE` is said, so the user sees why their config was passed over.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeGuard

DISAGREE = 2.0  # past this ratio the config's LR is not the job's (a schedule's warmup/decay stays within it)


@dataclass(frozen=True)
class BaseLr:
    lr: float
    source: str  # "--base-lr", "logged" or "config"
    note: str = ""  # why the config's LR was passed over, when it was


def _usable(lr: float | None) -> TypeGuard[float]:
    return lr is not None and math.isfinite(lr) and lr > 0


def choose_base_lr(explicit: float | None, logged: float | None, configured: float | None) -> BaseLr | None:
    """The LR a rollback scales: ``--base-lr``, else the job's logged LR, else the config's, else None."""
    if _usable(explicit):
        return BaseLr(explicit, "--base-lr")
    if _usable(logged):
        if not _usable(configured):
            return BaseLr(logged, "logged")
        ratio = max(configured / logged, logged / configured)
        note = (
            f"the config's train.learning_rate {configured:g} is {ratio:.3g}x the LR the job logged "
            f"({logged:g}): it is not the job's, so the rollback scales the logged one "
            "(--base-lr chooses another)"
            if ratio > DISAGREE
            else ""
        )
        return BaseLr(logged, "logged", note)
    if _usable(configured):
        return BaseLr(configured, "config")
    return None
