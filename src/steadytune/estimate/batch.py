"""Batch arithmetic: the effective batch an ``auto`` micro-batch keeps, and its divisors. Pure.

Shared by ``check`` (the recommendation) and the worker's ``auto`` micro-batch search,
so both keep the same effective batch.
"""

from __future__ import annotations

from steadytune.estimate.arch import Architecture
from steadytune.estimate.limits import max_micro_batch
from steadytune.estimate.setup import TrainSetup


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order (``n >= 1``)."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def largest_divisor_at_most(n: int, limit: int) -> int | None:
    fitting = [d for d in divisors(n) if d <= limit]
    return fitting[-1] if fitting else None


# Without train.auto_effective_batch, the estimate's micro-batch sets the effective batch; a
# small model on a big device would fit thousands of sequences, an effective batch no
# fine-tune wants (a 2,000-sample dataset would take one step per epoch), hence this cap.
AUTO_MICRO_BATCH_LIMIT = 64


def auto_effective_batch(
    arch: Architecture, setup: TrainSetup, budget: int | None, configured: int | None, accumulation: int
) -> int:
    """The effective batch an ``auto`` micro-batch keeps (see docs/preflight.md).

    ``train.auto_effective_batch`` when set; otherwise the estimate's largest micro-batch
    (at most :data:`AUTO_MICRO_BATCH_LIMIT`; 1 when not even 1 fits) times
    ``gradient_accumulation_steps``.
    """
    if configured:
        return configured
    best = max_micro_batch(arch, setup, budget) if budget is not None else None
    return min(AUTO_MICRO_BATCH_LIMIT, max(1, best or 1)) * accumulation
