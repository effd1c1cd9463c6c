"""What fits: the largest micro-batch and sequence length, and the changes that make a run fit.

The estimate grows monotonically with batch and sequence length, so both limits are an
exponential probe followed by a bisection: ~2 log2(limit) estimates, each a few
microseconds of arithmetic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from steadytune.estimate.arch import Architecture
from steadytune.estimate.memory import estimate_peak
from steadytune.estimate.setup import TrainSetup

# Far beyond any real micro-batch; stops the probe on absurdly large devices.
MAX_MICRO_BATCH = 1 << 16
MAX_SEQ = 1 << 24


def _largest(fits: Callable[[int], bool], cap: int) -> int | None:
    """The largest n in [1, cap] with fits(n), assuming fits is monotone (true then false)."""
    if not fits(1):
        return None
    low, high = 1, 2
    while high <= cap and fits(high):
        low, high = high, high * 2
    high = min(high, cap + 1)  # fits(high) is False or high is past the cap
    while high - low > 1:
        mid = (low + high) // 2
        if fits(mid):
            low = mid
        else:
            high = mid
    return low


def max_micro_batch(arch: Architecture, setup: TrainSetup, device_memory_bytes: int) -> int | None:
    """The largest micro-batch whose estimated peak fits in ``device_memory_bytes``.

    Args:
        arch: the architecture.
        setup: the training setup; its ``batch`` is ignored.
        device_memory_bytes: usable memory of one device.

    Returns:
        The largest micro-batch that fits (the next one does not), or None when not even
        a micro-batch of 1 fits.
    """

    def fits(batch: int) -> bool:
        return estimate_peak(arch, dataclasses.replace(setup, batch=batch)).peak_bytes <= device_memory_bytes

    return _largest(fits, MAX_MICRO_BATCH)


def max_seq_len(
    arch: Architecture, setup: TrainSetup, device_memory_bytes: int, cap: int | None = None
) -> int | None:
    """The longest sequence (at the setup's micro-batch) whose estimated peak fits.

    Args:
        arch: the architecture.
        setup: the training setup; its ``seq`` is ignored.
        device_memory_bytes: usable memory of one device.
        cap: the longest sequence worth considering; defaults to the model's
            ``max_position_embeddings``.

    Returns:
        The longest sequence that fits, or None when not even one token does.
    """
    limit = cap if cap is not None else min(arch.max_position_embeddings, MAX_SEQ)

    def fits(seq: int) -> bool:
        return estimate_peak(arch, dataclasses.replace(setup, seq=seq)).peak_bytes <= device_memory_bytes

    return _largest(fits, max(1, limit))


@dataclass(frozen=True)
class Suggestion:
    """One change to the setup and what it does to the peak."""

    change: str
    setup: TrainSetup
    peak_bytes: int
    fits: bool


def suggestions(arch: Architecture, setup: TrainSetup, device_memory_bytes: int) -> list[Suggestion]:
    """Single changes that bring the peak down, cheapest for the run first.

    The list keeps the effective batch where it changes the micro-batch (by raising
    gradient accumulation), and only offers a change that lowers the peak.

    Args:
        arch: the architecture.
        setup: the current setup.
        device_memory_bytes: usable memory of one device.

    Returns:
        The candidate changes with their estimated peaks, those that fit first.
    """
    current = estimate_peak(arch, setup).peak_bytes
    candidates: list[tuple[str, TrainSetup]] = []
    if not setup.gradient_checkpointing:
        candidates.append(
            ("enable gradient checkpointing", dataclasses.replace(setup, gradient_checkpointing=True))
        )
    best = max_micro_batch(arch, setup, device_memory_bytes)
    if best is not None and best < setup.batch:
        accum = setup.gradient_accumulation_steps * -(-setup.batch // best)
        candidates.append(
            (
                f"micro-batch {best} with gradient_accumulation_steps={accum} (same effective batch)",
                dataclasses.replace(setup, batch=best, gradient_accumulation_steps=accum),
            )
        )
    if setup.optimizer == "adamw":
        candidates.append(
            ("8-bit AdamW (optim=adamw_bnb_8bit)", dataclasses.replace(setup, optimizer="adamw8bit"))
        )
    if setup.attn == "eager":
        candidates.append(("attention sdpa instead of eager", dataclasses.replace(setup, attn="sdpa")))
    if setup.method == "full":
        candidates.append(
            (
                "LoRA r=16 on all linear layers",
                dataclasses.replace(setup, method="lora", lora_r=16, target_modules=("all-linear",)),
            )
        )
    if setup.method == "full":
        candidates.append(
            (
                "QLoRA (4-bit NF4 base) r=16 on all linear layers",
                dataclasses.replace(setup, method="qlora", lora_r=16, target_modules=("all-linear",)),
            )
        )
    elif setup.method == "lora":
        # One change at a time: the same adapter on a 4-bit base, so the figure is the base's saving alone.
        candidates.append(
            ("QLoRA (4-bit NF4 base), the same adapter", dataclasses.replace(setup, method="qlora"))
        )
    if not setup.gradient_checkpointing:
        # The usual fix: checkpointing plus the micro-batch it allows, accumulation keeping the
        # effective batch.
        ckpt = dataclasses.replace(setup, gradient_checkpointing=True)
        best_ckpt = max_micro_batch(arch, ckpt, device_memory_bytes)
        if best_ckpt is not None and best_ckpt < setup.batch:
            accum = setup.gradient_accumulation_steps * -(-setup.batch // best_ckpt)
            candidates.append(
                (
                    f"gradient checkpointing + micro-batch {best_ckpt} with "
                    f"gradient_accumulation_steps={accum}",
                    dataclasses.replace(ckpt, batch=best_ckpt, gradient_accumulation_steps=accum),
                )
            )
    if setup.gpus > 1 and setup.zero_stage < 3 and not setup.fsdp:
        candidates.append(
            (f"DeepSpeed ZeRO-3 over {setup.gpus} GPUs", dataclasses.replace(setup, zero_stage=3))
        )
    out = []
    for change, candidate in candidates:
        peak = estimate_peak(arch, candidate).peak_bytes
        # A change worth a line must save at least 2% of the peak.
        if peak < 0.98 * current:
            out.append(Suggestion(change, candidate, peak, peak <= device_memory_bytes))
    out.sort(key=lambda s: not s.fits)
    return out
