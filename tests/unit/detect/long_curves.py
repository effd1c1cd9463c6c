"""Seeded generators of long training curves: healthy shapes over a whole run, and trouble put into them.

A curve is a function of the fraction of the run, so the same shape is drawn at 100 points or at 10
million; records are yielded one at a time (never a list of a million). ``test_long_runs.py`` asserts on
them at sizes that run in seconds, ``benchmarks/long_runs.py`` at 1M and 10M points.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Iterator

from steadytune.records import Anomaly, StepRecord

Curve = Callable[[float], float]  # the clean loss at a fraction of the run
Trouble = Callable[[int, float, float], tuple[float, float]]  # (point, loss, grad) -> (loss, grad)

SHAPES: dict[str, Curve] = {
    # A fine-tune or a pretraining run that falls fast, then slowly (a power law in the steps).
    "power_law": lambda t: 2.0 + 8.0 * (1.0 + 1000.0 * t) ** -0.5,
    # An exponential decay over the whole run: slow from its first step on.
    "exponential": lambda t: 2.0 + 8.0 * math.exp(-5.0 * t),
    # A slow, steady decline under noise (30% over the run).
    "linear": lambda t: 4.0 * (1.0 - 0.3 * t),
    # A fast fall, then converged and flat for most of the run.
    "converged": lambda t: 1.0 + 2.0 * math.exp(-50.0 * t),
    # A loss that halves over the first 2% of the run, then falls slowly (a decaying hyperbola).
    "hyperbola": lambda t: 0.6 + 1.8 / (1.0 + 50.0 * t),
}
NOISES = (0.005, 0.03, 0.1)  # log-space sigma per point: a pretraining loss, a fine-tune, a small batch


def _grad(rng: random.Random) -> float:
    g = math.exp(rng.gauss(0.0, 0.2))
    return g * rng.uniform(1.5, 3.0) if rng.random() < 0.01 else g


def run(
    shape: str,
    n: int,
    sigma: float,
    seed: int,
    warmup: float = 0.01,
    trouble: Trouble | None = None,
    wide: float = 2.0,
) -> Iterator[StepRecord]:
    """``n`` per-step records of a healthy ``shape`` with log noise ``sigma`` (one point in ten ``wide``
    times as wide), an LR warm-up over ``warmup`` of the run then a cosine decay to 10% (``warmup`` 0: no LR
    logged); ``trouble(i, loss, grad)`` may replace the loss and grad norm of point ``i``."""
    rng = random.Random(f"{shape}:{n}:{sigma}:{seed}")
    curve = SHAPES[shape]
    warm = max(1, int(warmup * n))
    for i in range(n):
        t = i / n
        scale = wide if rng.random() < 0.1 else 1.0
        loss = curve(t) * math.exp(rng.gauss(0.0, sigma * scale))
        grad = _grad(rng)
        if trouble is not None:
            loss, grad = trouble(i, loss, grad)
        lr = 3e-4 * min(1.0, (i + 1) / warm) * (0.55 + 0.45 * math.cos(math.pi * t)) if warmup else None
        yield StepRecord(ts=float(i), step=i + 1, loss=loss, grad_norm=grad, lr=lr)


def severe(anomalies: Iterable[Anomaly]) -> list[tuple[str, int]]:
    """(kind, first step) of each warning or critical anomaly."""
    return [(a.kind, a.start_step) for a in anomalies if a.severity != "info"]


def at(n: int) -> int:
    """The point trouble is put in: 70% through the run."""
    return int(0.7 * n)


def _spike(n: int) -> Trouble:
    return lambda i, loss, g: (loss * 3.0 if i == at(n) else loss, g)


def _climb(n: int) -> Trouble:
    return lambda i, loss, g: (loss * 3.0 ** min(1.0, max(0, i - at(n)) / 50), g)


def _swing(n: int) -> Trouble:
    return lambda i, loss, g: (
        loss * math.exp(0.25 * math.sin(2 * math.pi * i / 8)) if i >= at(n) else loss,
        g,
    )


def _grad_spike(n: int) -> Trouble:
    return lambda i, loss, g: (loss, g * 30.0 if i == at(n) else g)


def _nan(n: int) -> Trouble:
    return lambda i, loss, g: (math.nan if i == at(n) else loss, g)


def _zero(n: int) -> Trouble:
    return lambda i, loss, g: (0.0 if i >= at(n) else loss, g)


# kind -> (the trouble for a run of n points, the kinds that find it, within how many points of it)
TROUBLE: dict[str, tuple[Callable[[int], Trouble], frozenset[str], int]] = {
    "loss_spike": (_spike, frozenset({"loss_spike"}), 1),
    "divergence": (_climb, frozenset({"divergence", "loss_spike"}), 60),
    "oscillation": (_swing, frozenset({"oscillation"}), 200),
    "grad_spike": (_grad_spike, frozenset({"grad_spike", "grad_explosion"}), 1),
    "nan_loss": (_nan, frozenset({"nan_loss"}), 0),
    "loss_collapse": (_zero, frozenset({"loss_collapse"}), 0),
}


def never_learns(n: int) -> Trouble:
    """A loss flat at 3.0 from the first step (drawn over the ``linear`` shape, whose start is 4.0)."""
    return lambda i, loss, g: (3.0 * loss / SHAPES["linear"](i / n), g)
