"""The training shape to use: micro-batch, accumulation (same effective batch), sequence, checkpointing.

The effective batch per device (micro-batch x gradient accumulation) is what the
optimizer sees, so it is kept exactly: the micro-batch is always a divisor of it.
Gradient checkpointing is recommended only when nothing fits without it, because it
recomputes every layer in backward (about a third more compute).
"""

from __future__ import annotations

import dataclasses

from steadytune.estimate import Architecture, TrainSetup, estimate_peak, max_seq_len
from steadytune.estimate.batch import divisors
from steadytune.preflight.result import Recommendation


def recommend(
    arch: Architecture, setup: TrainSetup, budget: int | None, effective_batch: int
) -> Recommendation:
    """The micro-batch, accumulation, sequence length and checkpointing that fit ``budget``.

    Args:
        arch: the model.
        setup: the configured setup (its batch and accumulation are replaced).
        budget: usable bytes per device (free minus headroom); None gives no recommendation.
        effective_batch: micro-batch x accumulation to keep.
    """
    seq = min(setup.seq, arch.max_position_embeddings)
    notes: list[str] = []
    if seq < setup.seq:
        notes.append(f"max_seq_length {setup.seq} is beyond the model's max_position_embeddings {seq}")
    if budget is None or budget <= 0:
        return Recommendation(
            None,
            None,
            seq,
            None,
            effective_batch,
            None,
            budget,
            ("device memory unknown: no micro-batch recommended",),
        )
    base = dataclasses.replace(setup, seq=seq, batch=1, gradient_accumulation_steps=1)
    off = _largest_micro_batch(arch, base, effective_batch, budget, ckpt=False)
    if off is not None:
        ckpt, batch = False, off
        on = _largest_micro_batch(arch, base, effective_batch, budget, ckpt=True)
        why = f"micro-batch {off} fits without gradient checkpointing"
        if on is not None and on > off:
            why += f" ({on} would fit with it, at ~1/3 more compute)"
        notes.append(why)
    else:
        on = _largest_micro_batch(arch, base, effective_batch, budget, ckpt=True)
        if on is not None:
            ckpt, batch = True, on
            notes.append(f"gradient checkpointing needed: no micro-batch fits without it, {on} fits with it")
        else:
            ckpt, batch = True, 1
            one = dataclasses.replace(
                base, gradient_checkpointing=True, gradient_accumulation_steps=effective_batch
            )
            fit_seq = max_seq_len(arch, one, budget, cap=seq)
            if fit_seq is None:
                return Recommendation(
                    None,
                    None,
                    None,
                    True,
                    effective_batch,
                    None,
                    budget,
                    (*notes, "not even one token fits: use a smaller model, LoRA/QLoRA, or more memory"),
                )
            notes.append(
                f"even micro-batch 1 at seq {seq} does not fit; seq {fit_seq} does, with checkpointing"
            )
            seq = fit_seq
    accum = effective_batch // batch
    notes.append(f"effective batch {effective_batch} = micro-batch {batch} x accumulation {accum}")
    final = dataclasses.replace(
        base, batch=batch, gradient_accumulation_steps=accum, gradient_checkpointing=ckpt, seq=seq
    )
    return Recommendation(
        batch, accum, seq, ckpt, effective_batch, estimate_peak(arch, final).peak_bytes, budget, tuple(notes)
    )


def _largest_micro_batch(
    arch: Architecture, base: TrainSetup, effective_batch: int, budget: int, ckpt: bool
) -> int | None:
    """The largest divisor of ``effective_batch`` whose micro-batch fits ``budget``; None if not even 1."""
    # Accumulation keeps gradients alive between micro-batches, so each candidate is
    # estimated with the accumulation it would run with.
    for b in reversed(divisors(effective_batch)):
        s = dataclasses.replace(
            base, batch=b, gradient_accumulation_steps=effective_batch // b, gradient_checkpointing=ckpt
        )
        if estimate_peak(arch, s).peak_bytes <= budget:
            return b
    return None
