"""Config lints: values that validate but are likely mistakes. Pure functions of the config.

A lint warns; it fails only where the run could not do what the config asks (no
checkpoint would ever be written). Hard config errors are the config loader's job.
"""

from __future__ import annotations

import math

from steadytune.config.safe_mode import MAX_LR, USUAL_LR
from steadytune.config.schema import SteadytuneConfig
from steadytune.estimate import Architecture
from steadytune.layerwise import rank_of
from steadytune.preflight.layerwise import adapted_modules, lr_group_lints, rank_lints
from steadytune.preflight.result import Check, fail, ok, warn

# The bottom of the usual LR range per method; 100x below it the weights barely move.
LOW_LR = {"full": 1e-5, "lora": 1e-4, "qlora": 1e-4}
# LoRA scales its update by alpha / r; PEFT's default is 1 (alpha = r), common practice 2.
LORA_SCALE_RANGE = (0.25, 8.0)
LORA_R_USUAL_MAX = 256
LORA_DROPOUT_MAX = 0.3
MANY_CHECKPOINTS = 100
# Hyperparameter lints (docs/preflight.md gives the reasoning): a dataset below this many samples
# is small enough for a LoRA adapter to memorize; a rank above HIGH_R on it is an overfitting risk.
SMALL_DATASET = 1000
HIGH_R = 32
# The narrowest hidden size the usual LR ranges hold for; a narrower model takes a higher LR.
LR_REFERENCE_WIDTH = 1024


def lr_scale_for_width(arch: Architecture | None) -> float:
    """How much higher than the usual range a model this narrow takes its learning rate: 1 from
    LR_REFERENCE_WIDTH up (or when the shape is unknown).

    Adam moves every weight by about the LR whatever its gradient, so a hidden layer's output moves
    in proportion to its fan-in times the LR: the LR that moves it as far goes as 1 / width (muP,
    Yang et al. 2022). The usual ranges are those of the models people fine-tune, none narrower
    than about 900 (Qwen2.5-0.5B); the demo's 128-wide model trains steadily at 2e-3, 20x the top
    of the full fine-tune's range.
    """
    if arch is None or arch.hidden_size >= LR_REFERENCE_WIDTH:
        return 1.0
    return LR_REFERENCE_WIDTH / arch.hidden_size


def lr_lint(cfg: SteadytuneConfig, arch: Architecture | None = None) -> Check:
    lr, method = cfg.train.learning_rate, cfg.method
    scale = lr_scale_for_width(arch)
    usual = USUAL_LR[method]
    if scale > 1 and arch is not None:
        low, high = LOW_LR[method] * scale, MAX_LR[method] / 10 * scale  # MAX_LR: 10x the top
        usual = f"{low:.2g} to {high:.2g} at hidden size {arch.hidden_size}"
    if lr > MAX_LR[method] * scale:
        return warn(
            "config",
            "learning_rate",
            f"learning_rate={lr:g} is far above the usual range for {method} ({usual}): expect loss "
            "spikes or divergence",
            f"use a value in {usual}",
            learning_rate=lr,
        )
    if lr < LOW_LR[method] * scale / 100:
        return warn(
            "config",
            "learning_rate",
            f"learning_rate={lr:g} is far below the usual range for {method} ({usual}): the weights will "
            "barely move",
            f"use a value in {usual}",
            learning_rate=lr,
        )
    return ok("config", "learning_rate", f"learning_rate={lr:g} (usual for {method}: {usual})")


def lora_lints(cfg: SteadytuneConfig, arch: Architecture | None) -> list[Check]:
    if cfg.method not in ("lora", "qlora"):
        return []
    lo = cfg.lora
    scale = lo.lora_alpha / lo.r
    out: list[Check] = []
    if not LORA_SCALE_RANGE[0] <= scale <= LORA_SCALE_RANGE[1]:
        effect = (
            "the adapters will learn very slowly" if scale < 1 else "the updates are amplified and unstable"
        )
        out.append(
            warn(
                "config",
                "lora_alpha",
                f"lora_alpha/r = {lo.lora_alpha:g}/{lo.r} = {scale:.3g}: {effect}",
                f"set lora.lora_alpha to r or 2 x r ({lo.r} or {2 * lo.r})",
                scale=scale,
            )
        )
    limit = LORA_R_USUAL_MAX
    if arch is not None:
        limit = min(limit, arch.hidden_size // 2)
    if lo.r > limit:
        out.append(
            warn(
                "config",
                "lora_r",
                f"r={lo.r} is beyond the usual 8-{limit}"
                + (f" for hidden size {arch.hidden_size}" if arch is not None else "")
                + ": the adapter costs memory and time without a gain in quality",
                "use r between 8 and 64; raise it only if a smaller r underfits",
                r=lo.r,
            )
        )
    if lo.lora_dropout > LORA_DROPOUT_MAX:
        out.append(
            warn(
                "config",
                "lora_dropout",
                f"lora_dropout={lo.lora_dropout:g} drops most of the adapter input",
                "use 0.0-0.1",
            )
        )
    if not out:
        out.append(
            ok(
                "config",
                "lora",
                f"r={lo.r}, lora_alpha={lo.lora_alpha:g} (scale {scale:.3g}), dropout {lo.lora_dropout:g}",
            )
        )
    return out


def seq_lint(cfg: SteadytuneConfig, arch: Architecture | None) -> Check:
    seq = cfg.data.max_seq_length
    if arch is None:
        return ok("config", "max_seq_length", f"max_seq_length={seq} (model limits unknown)")
    limit = arch.max_position_embeddings
    if seq > limit:
        return warn(
            "config",
            "max_seq_length",
            f"max_seq_length={seq} is beyond the model's max_position_embeddings={limit}: positions past "
            "it were never trained",
            f"set data.max_seq_length to {limit} or less (or configure RoPE scaling)",
            limit=limit,
        )
    return ok("config", "max_seq_length", f"max_seq_length={seq} (model supports {limit})")


def total_steps(cfg: SteadytuneConfig, samples: int | None) -> int | None:
    """Optimizer steps the run will take: ``max_steps``, or epochs over the data when -1."""
    t = cfg.train
    if t.max_steps > 0:
        return t.max_steps
    if samples is None or not isinstance(t.per_device_train_batch_size, int):
        return None
    per_step = t.per_device_train_batch_size * t.gradient_accumulation_steps * cfg.run.nproc_per_node
    return max(1, math.ceil(samples / per_step * t.num_train_epochs))


def schedule_lints(cfg: SteadytuneConfig, samples: int | None) -> list[Check]:
    """save_steps (and eval/warmup) against the number of steps the run takes."""
    t = cfg.train
    steps = total_steps(cfg, samples)
    if steps is None:
        return [
            ok(
                "config",
                "save_steps",
                f"save_steps={t.save_steps} (run length unknown until the data is read)",
            )
        ]
    out: list[Check] = []
    if t.save_steps > steps:
        out.append(
            fail(
                "config",
                "save_steps",
                f"save_steps={t.save_steps} > {steps} steps in the run: no checkpoint before the end, so a "
                "crash restarts from zero",
                f"set train.save_steps to {max(1, steps // 4)} or less",
                steps=steps,
            )
        )
    elif steps // t.save_steps > MANY_CHECKPOINTS:
        out.append(
            warn(
                "config",
                "save_steps",
                f"save_steps={t.save_steps} writes {steps // t.save_steps} checkpoints in {steps} steps",
                f"save every {max(1, steps // 20)} steps or so",
                steps=steps,
            )
        )
    else:
        out.append(ok("config", "save_steps", f"a checkpoint every {t.save_steps} of {steps} steps"))
    if t.warmup_steps >= steps:
        out.append(
            warn(
                "config",
                "warmup_steps",
                f"warmup_steps={t.warmup_steps} >= {steps} steps: the LR never reaches its peak",
                f"use about {max(1, steps // 10)}",
            )
        )
    if t.eval_steps is not None and cfg.data.eval_file and t.eval_steps > steps:
        out.append(
            warn(
                "config",
                "eval_steps",
                f"eval_steps={t.eval_steps} > {steps} steps: never evaluated",
                f"set train.eval_steps to {max(1, steps // 4)} or less",
            )
        )
    return out


def batch_lint(cfg: SteadytuneConfig, samples: int | None, fits_micro_batch: int | None) -> Check:
    """Gradient accumulation against the micro-batch and the dataset."""
    t = cfg.train
    n = cfg.run.nproc_per_node
    if not isinstance(t.per_device_train_batch_size, int):
        target = t.auto_effective_batch
        return ok(
            "config",
            "batch",
            "per_device_train_batch_size: auto (found at start, keeping effective batch "
            + (f"{target})" if target else "= estimate x gradient_accumulation_steps)"),
        )
    b, a = t.per_device_train_batch_size, t.gradient_accumulation_steps
    eff = b * a * n
    text = f"effective batch {eff} = micro-batch {b} x accumulation {a}" + (
        f" x {n} processes" if n > 1 else ""
    )
    if samples is not None and eff > samples:
        return warn(
            "config",
            "batch",
            text + f" > {samples} samples: one step needs more than the whole dataset",
            "lower gradient_accumulation_steps or per_device_train_batch_size",
            effective_batch=eff,
        )
    if a > 1 and fits_micro_batch is not None and fits_micro_batch > b and (b * a) % fits_micro_batch == 0:
        return warn(
            "config",
            "batch",
            text + f"; micro-batch {fits_micro_batch} fits, so fewer, larger micro-batches "
            "give the same update faster",
            f"per_device_train_batch_size: {fits_micro_batch}, gradient_accumulation_steps: "
            f"{b * a // fits_micro_batch}",
            effective_batch=eff,
        )
    return ok("config", "batch", text, effective_batch=eff)


def clipping_lint(cfg: SteadytuneConfig) -> Check | None:
    if cfg.train.max_grad_norm == 0:
        return warn(
            "config",
            "max_grad_norm",
            "gradient clipping is off (max_grad_norm=0): one bad batch can blow the weights up",
            "set train.max_grad_norm: 1.0",
        )
    return None


def weight_decay_lint(cfg: SteadytuneConfig) -> Check | None:
    if cfg.method != "full" or cfg.train.weight_decay > 0:
        return None
    return warn(
        "config",
        "weight_decay",
        "weight_decay=0 on a full fine-tune: every weight trains and nothing pulls it back, so the model "
        "drifts from its pretrained weights and overfits sooner",
        "set train.weight_decay: 0.01 (0.1 for long runs)",
    )


def small_data_lints(cfg: SteadytuneConfig, arch: Architecture | None, samples: int | None) -> list[Check]:
    """LoRA regularization against the dataset size: no dropout, or a high rank, on little data."""
    if cfg.method not in ("lora", "qlora") or samples is None or samples >= SMALL_DATASET:
        return []
    lo = cfg.lora
    out = []
    if lo.lora_dropout == 0:
        out.append(
            warn(
                "config",
                "lora_dropout_small_data",
                f"lora_dropout=0 with {samples} training samples (under {SMALL_DATASET}): on this little "
                f"data "
                "the adapter can memorize it, and dropout is its only regularizer",
                "set lora.lora_dropout: 0.05 (0.1 for models up to 13B)",
                samples=samples,
            )
        )
    top = max([lo.r, *lo.rank_pattern.values()])
    if top > HIGH_R:
        size = ""
        if arch is not None:
            params = sum(
                rank_of(n, lo.r, lo.rank_pattern) * (i + o) for n, i, o in adapted_modules(cfg, arch)
            )
            size = f" ({params:,} adapter parameters, {params // samples:,} per sample)"
        out.append(
            warn(
                "config",
                "lora_r_small_data",
                (f"r={top}" if top == lo.r else f"a rank of {top} (rank_pattern)")
                + f" on a small dataset of {samples} samples{size}: a high rank on little data "
                "fits the samples rather than the task (overfitting risk)",
                f"use r 8-{HIGH_R // 2} at this size, raise it with more data, and watch the eval loss",
                samples=samples,
                r=top,
            )
        )
    return out


def config_lints(
    cfg: SteadytuneConfig,
    arch: Architecture | None,
    samples: int | None = None,
    fits_micro_batch: int | None = None,
) -> list[Check]:
    """Every lint, in the order they are shown."""
    out = [
        lr_lint(cfg, arch),
        *lora_lints(cfg, arch),
        *rank_lints(cfg, arch),
        *lr_group_lints(cfg, arch),
        *small_data_lints(cfg, arch, samples),
        seq_lint(cfg, arch),
        *schedule_lints(cfg, samples),
        batch_lint(cfg, samples, fits_micro_batch),
    ]
    extra = [clipping_lint(cfg), weight_decay_lint(cfg)]
    return out + [c for c in extra if c is not None]
