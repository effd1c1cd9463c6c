"""Per-layer LoRA ranks and per-group learning rates, as pure functions of names.

Torch-free, so the runner, the estimator, ``check`` and the supervisor agree on
which module gets which rank and which parameter gets which LR:

- ``lora.rank_pattern`` / ``lora.alpha_pattern`` follow PEFT exactly: a key matches a
  module whose full name ends with it as a regex (``(.*\\.)?KEY$``), and the first
  matching key, in the order written, wins.
- ``train.lr_groups`` entries match parameter names with ``re.search``; the first
  entry that matches wins, the others are not consulted. Parameters no entry matches
  are in the ``default`` group (scale 1).
- ``train.loraplus_lr_ratio`` multiplies the LR of every LoRA B matrix on top of its
  group's scale (LoRA+, Hayou et al. 2024), so B matrices form their own groups,
  named ``<group>.lora_B``.
- ``train.layer_decay`` multiplies the LR of decoder layer ``i`` of ``L`` by
  ``decay ** (L - 1 - i)``: the top layer and the head keep the full LR, the
  embeddings get ``decay ** L``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from steadytune.layers import EMBEDDINGS, layer_of

if TYPE_CHECKING:  # the estimator imports this module and needs none of the config's models
    from steadytune.config.schema import TrainConfig

DEFAULT_GROUP = "default"
LORA_B_SUFFIX = ".lora_B"
# PEFT names its B matrices ``...lora_B.<adapter>.weight`` (``lora_embedding_B`` for embeddings).
_LORA_B = re.compile(r"(?:^|\.)lora_(?:embedding_)?B(?:\.|$)")


def pattern_key(patterns: Iterable[str], module_name: str) -> str | None:
    """The first of ``patterns`` that PEFT would apply to ``module_name``, or None."""
    for key in patterns:
        if re.match(rf"(.*\.)?({key})$", module_name):
            return key
    return None


def rank_of(module_name: str, r: int, rank_pattern: Mapping[str, int]) -> int:
    """The LoRA rank PEFT gives ``module_name`` (e.g. ``model.layers.3.self_attn.q_proj``)."""
    key = pattern_key(rank_pattern, module_name)
    return rank_pattern[key] if key is not None else r


def alpha_of(module_name: str, alpha: float, alpha_pattern: Mapping[str, float]) -> float:
    key = pattern_key(alpha_pattern, module_name)
    return alpha_pattern[key] if key is not None else alpha


@dataclass(frozen=True)
class LrGroup:
    """One ``train.lr_groups`` entry, flat."""

    name: str
    match: str
    lr_scale: float


def is_lora_b(param_name: str) -> bool:
    return bool(_LORA_B.search(param_name))


def config_group(param_name: str, groups: Sequence[LrGroup], loraplus_ratio: float | None) -> str:
    """The configured group of a parameter: the first matching entry, plus ``.lora_B`` under LoRA+."""
    name = next((g.name for g in groups if re.search(g.match, param_name)), DEFAULT_GROUP)
    return name + LORA_B_SUFFIX if loraplus_ratio is not None and is_lora_b(param_name) else name


def group_lrs(
    base_lr: float, groups: Sequence[LrGroup], loraplus_ratio: float | None
) -> tuple[tuple[str, float], ...]:
    """The LR of every configured group before layer decay: what a plan revision records."""
    scaled = [(DEFAULT_GROUP, base_lr), *((g.name, base_lr * g.lr_scale) for g in groups)]
    if loraplus_ratio is None:
        return tuple(scaled)
    return tuple(
        pair for name, lr in scaled for pair in ((name, lr), (name + LORA_B_SUFFIX, lr * loraplus_ratio))
    )


def num_layers(param_names: Iterable[str]) -> int:
    """Decoder layers among ``param_names`` (the largest block index + 1)."""
    indexes = [key[1] for _, key in map(layer_of, param_names) if key[0] == 1]
    return max(indexes) + 1 if indexes else 0


def layer_factor(param_name: str, layers: int, decay: float | None) -> tuple[str | None, float]:
    """``(layer label, LR factor)`` under layer-wise decay; ``(None, 1.0)`` without it."""
    if decay is None or layers == 0:
        return None, 1.0
    label, key = layer_of(param_name)
    if key[0] == 0 and label == EMBEDDINGS:
        return label, decay**layers
    if key[0] == 1:
        return label, decay ** (layers - 1 - key[1])
    # The final norm, the head and anything outside the blocks sit above the top layer.
    return None, 1.0


def group_label(group: str, layer: str | None) -> str:
    return f"{group}@{layer}" if layer else group


def assign_groups(
    param_names: Sequence[str],
    base_lr: float,
    groups: Sequence[LrGroup],
    loraplus_ratio: float | None,
    decay: float | None,
    planned: Mapping[str, float] | None = None,
) -> dict[str, tuple[float, list[str]]]:
    """Optimizer groups by label: ``{label: (lr, parameter names)}``, in first-seen order.

    ``planned`` is a plan revision's record of the configured groups' LRs; when given, it
    wins over ``base_lr`` x scale, so what the plan says is what the optimizer gets.
    """
    lrs = dict(group_lrs(base_lr, groups, loraplus_ratio))
    if planned:
        lrs.update(planned)
    layers = num_layers(param_names) if decay is not None else 0
    out: dict[str, tuple[float, list[str]]] = {}
    for name in param_names:
        group = config_group(name, groups, loraplus_ratio)
        layer, factor = layer_factor(name, layers, decay)
        label = group_label(group, layer)
        if label not in out:
            out[label] = (lrs[group] * factor, [])
        out[label][1].append(name)
    return out


def unmatched_groups(param_names: Sequence[str], groups: Sequence[LrGroup]) -> list[LrGroup]:
    """Entries that match no parameter at all."""
    return [g for g in groups if not any(re.search(g.match, n) for n in param_names)]


def overlaps(param_names: Sequence[str], groups: Sequence[LrGroup]) -> list[tuple[LrGroup, LrGroup, int]]:
    """``(winner, shadowed, count)``: parameters two entries both match; the earlier one wins them."""
    out = []
    for i, first in enumerate(groups):
        for later in groups[i + 1 :]:
            both = sum(1 for n in param_names if re.search(first.match, n) and re.search(later.match, n))
            if both:
                out.append((first, later, both))
    return out


def groups_of(train: TrainConfig) -> list[LrGroup]:
    return [LrGroup(g.label, g.match, g.lr_scale) for g in train.lr_groups]


def planned_group_lrs(train: TrainConfig, lr_scale: float = 1.0) -> tuple[tuple[str, float], ...]:
    """What a run's first plan revision records; empty for a run with a single LR."""
    if not (train.lr_groups or train.loraplus_lr_ratio is not None or train.layer_decay is not None):
        return ()
    return group_lrs(train.learning_rate * lr_scale, groups_of(train), train.loraplus_lr_ratio)
