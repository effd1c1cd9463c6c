"""Optimizer parameter groups for per-group LRs, and the planned LRs kept across a resume.

Which parameter gets which LR is decided by :mod:`steadytune.layerwise` (pure,
shared with ``check`` and the supervisor); this module only turns that into the
``param_groups`` of a torch optimizer, keeping the HF Trainer's split into weights
with and without weight decay.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from steadytune.layerwise import LrGroup, assign_groups

# Each optimizer group carries its label and its LR relative to the run's base LR, so the
# guard can report the base LR as scheduled whatever group comes first.
NAME_KEY = "name"
FACTOR_KEY = "lr_factor"


@dataclass(frozen=True)
class LrPlan:
    """What the optimizer's groups are built from: the config's groups and the plan's LRs."""

    base_lr: float
    groups: Sequence[LrGroup] = ()
    loraplus_ratio: float | None = None
    layer_decay: float | None = None
    planned: Mapping[str, float] = field(default_factory=dict)

    @property
    def grouped(self) -> bool:
        return bool(self.groups) or self.loraplus_ratio is not None or self.layer_decay is not None


def param_groups(
    named: Iterable[tuple[str, Any]], plan: LrPlan, decay_names: set[str], weight_decay: float
) -> list[dict[str, Any]]:
    """``param_groups`` for a torch optimizer: one per (LR group, with/without weight decay)."""
    params = {n: p for n, p in named if p.requires_grad}
    assigned = assign_groups(
        list(params), plan.base_lr, plan.groups, plan.loraplus_ratio, plan.layer_decay, plan.planned
    )
    out: list[dict[str, Any]] = []
    for label, (lr, names) in assigned.items():
        for decays in (True, False):
            chosen = [params[n] for n in names if (n in decay_names) == decays]
            if chosen:
                out.append(
                    {
                        "params": chosen,
                        "lr": lr,
                        "weight_decay": weight_decay if decays else 0.0,
                        NAME_KEY: label,
                        FACTOR_KEY: lr / plan.base_lr,
                    }
                )
    return out


def group_summary(groups: Sequence[dict[str, Any]]) -> dict[str, float]:
    """``{label: planned LR}`` of an optimizer's groups (the two weight-decay halves share one)."""
    return {str(g.get(NAME_KEY, "default")): float(g.get("initial_lr", g["lr"])) for g in groups}
