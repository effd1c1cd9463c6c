"""Lints of per-layer LoRA ranks and per-group LRs, against the model's own module names.

The names come from the architecture (no model is loaded): HF Llama-style modules, and
the parameter names PEFT gives their adapters, which is what ``rank_pattern`` and
``train.lr_groups`` are matched against at run time (:mod:`steadytune.layerwise`).
"""

from __future__ import annotations

import re

from steadytune.config.schema import SteadytuneConfig
from steadytune.estimate import Architecture
from steadytune.estimate.setup import expand_target_modules
from steadytune.layerwise import groups_of, overlaps, pattern_key, rank_of, unmatched_groups
from steadytune.preflight.result import Check, ok, warn

# Below this, the bottom layer trains at under 1% of the LR: in effect frozen.
MIN_LAYER_FACTOR = 0.01


def adapted_modules(cfg: SteadytuneConfig, arch: Architecture) -> list[tuple[str, int, int]]:
    """``(module name, in, out)`` of every module LoRA adapts."""
    targets = cfg.lora.target_modules
    chosen = set(expand_target_modules((targets,) if isinstance(targets, str) else tuple(targets)))
    return [
        (arch.module_name(i, lin.name), lin.in_features, lin.out_features)
        for i in range(arch.num_layers)
        for lin in arch.linears()
        if lin.name in chosen
    ]


def trainable_names(cfg: SteadytuneConfig, arch: Architecture) -> list[str]:
    """The names of the parameters the optimizer will see, as ``named_parameters`` gives them."""
    if cfg.method in ("lora", "qlora"):
        return [
            f"base_model.model.{name}.lora_{ab}.default.weight"
            for name, _, _ in adapted_modules(cfg, arch)
            for ab in ("A", "B")
        ]
    names = ["model.embed_tokens.weight"]
    for i in range(arch.num_layers):
        names += [f"{arch.module_name(i, lin.name)}.weight" for lin in arch.linears()]
        names += [
            f"model.layers.{i}.input_layernorm.weight",
            f"model.layers.{i}.post_attention_layernorm.weight",
        ]
    names.append("model.norm.weight")
    return names if arch.tie_word_embeddings else [*names, "lm_head.weight"]


def rank_lints(cfg: SteadytuneConfig, arch: Architecture | None) -> list[Check]:
    """Ranks beyond a matrix's dimension, and rank/alpha pattern keys that adapt nothing."""
    lo = cfg.lora
    if cfg.method not in ("lora", "qlora") or not (lo.rank_pattern or lo.alpha_pattern):
        return []
    if arch is None:
        return [ok("config", "rank_pattern", "rank_pattern not checked: the model's shapes are unknown")]
    modules = adapted_modules(cfg, arch)
    out: list[Check] = []
    too_big: dict[tuple[str, int, int], int] = {}  # (module kind, rank, limit) -> count
    for name, fan_in, fan_out in modules:
        r, limit = rank_of(name, lo.r, lo.rank_pattern), min(fan_in, fan_out)
        if r > limit:
            where = (name.rsplit(".", 1)[-1], r, limit)
            too_big[where] = too_big.get(where, 0) + 1
    for (kind, r, limit), count in too_big.items():
        out.append(
            warn(
                "config",
                "lora_rank_pattern",
                f"rank {r} on {kind} ({count} module{'s' if count > 1 else ''}) is beyond the matrix's "
                f"smaller dimension {limit}: a LoRA update of that matrix cannot have a rank above {limit}, "
                "so the extra rank costs memory and time and adds nothing",
                f"set the rank_pattern entry (or lora.r) for {kind} to {limit} or less",
                module=kind,
                rank=r,
                limit=limit,
            )
        )
    for what, pattern in (("rank_pattern", lo.rank_pattern), ("alpha_pattern", lo.alpha_pattern)):
        names = [n for n, _, _ in modules]
        # PEFT gives a module the first key that matches; a key that never comes first has no effect.
        first = {pattern_key(pattern, n) for n in names}
        for key in pattern:
            if key not in first:
                shadowed = any(re.match(rf"(.*\.)?({key})$", n) for n in names)
                out.append(
                    warn(
                        "config",
                        f"lora_{what}_unused",
                        f"lora.{what} key {key!r} "
                        + (
                            "matches only modules an earlier key already sets (the first key wins)"
                            if shadowed
                            else "matches no adapted module"
                        )
                        + ": it has no effect",
                        "list the more specific key first, or match the end of a module name such as "
                        f"{names[0] if names else 'model.layers.0.self_attn.q_proj'}",
                        key=key,
                    )
                )
    if not out:
        ranks = sorted({rank_of(n, lo.r, lo.rank_pattern) for n, _, _ in modules})
        out.append(
            ok(
                "config",
                "rank_pattern",
                f"LoRA ranks {', '.join(map(str, ranks))} over {len(modules)} modules",
            )
        )
    return out


def lr_group_lints(cfg: SteadytuneConfig, arch: Architecture | None) -> list[Check]:
    """Groups that match nothing, overlapping groups (the first listed wins), a decay that freezes."""
    t = cfg.train
    if not (t.lr_groups or t.layer_decay is not None):
        return []
    if arch is None:
        return [ok("config", "lr_groups", "lr_groups not checked: the model's shapes are unknown")]
    names = trainable_names(cfg, arch)
    groups = groups_of(t)
    out: list[Check] = []
    for g in unmatched_groups(names, groups):
        out.append(
            warn(
                "config",
                "lr_groups",
                f"train.lr_groups entry {g.name!r} (match {g.match!r}) matches no trainable parameter: "
                "it has no effect",
                f"write a regex found in names such as {names[len(names) // 2]}",
                group=g.name,
            )
        )
    for first, later, count in overlaps(names, groups):
        out.append(
            warn(
                "config",
                "lr_groups_overlap",
                f"train.lr_groups entries {first.name!r} and {later.name!r} both match {count} parameters; "
                f"the first listed, {first.name!r} (x{first.lr_scale:g}), wins them, so {later.name!r} "
                f"(x{later.lr_scale:g}) does not apply there",
                "make the regexes disjoint, or list the more specific entry first",
                winner=first.name,
                shadowed=later.name,
                parameters=count,
            )
        )
    if t.layer_decay is not None and arch.num_layers > 1:
        bottom = t.layer_decay ** (arch.num_layers - 1)
        if bottom < MIN_LAYER_FACTOR:
            out.append(
                warn(
                    "config",
                    "layer_decay",
                    f"layer_decay={t.layer_decay:g} over {arch.num_layers} layers gives layer 0 "
                    f"x{bottom:.2g} "
                    "of the LR: the bottom layers barely train",
                    f"use a decay of at least {MIN_LAYER_FACTOR ** (1 / (arch.num_layers - 1)):.3f}",
                    factor=bottom,
                )
            )
    if not out:
        labels = ", ".join(f"{g.name} x{g.lr_scale:g}" for g in groups) or "one group"
        decay = f"; layer_decay {t.layer_decay:g}" if t.layer_decay is not None else ""
        out.append(ok("config", "lr_groups", f"LR groups: {labels}{decay}"))
    return out
