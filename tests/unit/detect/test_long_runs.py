"""Long runs judged by the same rules as short ones: healthy curves of several shapes raise nothing,
and trouble injected late into them is found.

The curves are generated point by point (an iterator of records, never a list of a million), over
lengths from 100 to 100,000 logged points; the 1M- and 10M-point versions of the same shapes are in
``benchmarks/long_runs.py``, which prints what each raised and how long it took.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator

import pytest

from steadytune.detect import detect
from steadytune.records import Anomaly, StepRecord

Curve = Callable[[float], float]  # the clean loss at a fraction of the run

SHAPES: dict[str, Curve] = {
    # A fine-tune or a pretraining run that falls fast, then slowly (a power law in the steps).
    "power_law": lambda t: 2.0 + 8.0 * (1.0 + 1000.0 * t) ** -0.5,
    # An exponential decay over the whole run: slow from its first step on.
    "exponential": lambda t: 2.0 + 8.0 * math.exp(-5.0 * t),
    # A slow, steady decline under noise (30% over the run).
    "linear": lambda t: 4.0 * (1.0 - 0.3 * t),
    # A fast fall, then converged and flat for most of the run.
    "converged": lambda t: 1.0 + 2.0 * math.exp(-50.0 * t),
}


def _grad(rng: random.Random) -> float:
    g = math.exp(rng.gauss(0.0, 0.2))
    return g * rng.uniform(1.5, 3.0) if rng.random() < 0.01 else g


def run(
    shape: str,
    n: int,
    sigma: float,
    seed: int,
    warmup: float = 0.01,
    trouble: Callable[[int, float, float], tuple[float, float]] | None = None,
) -> Iterator[StepRecord]:
    """``n`` per-step records of a healthy ``shape`` with log noise ``sigma`` (one point in ten twice as
    wide) and an LR warm-up over ``warmup`` of the run (0: no LR logged); ``trouble(i, loss, grad)``
    may replace the loss and grad norm of point ``i``."""
    rng = random.Random(f"{shape}:{n}:{sigma}:{seed}")
    curve = SHAPES[shape]
    warm = max(1, int(warmup * n))
    for i in range(n):
        t = i / n
        wide = 2.0 if rng.random() < 0.1 else 1.0
        loss = curve(t) * math.exp(rng.gauss(0.0, sigma * wide))
        grad = _grad(rng)
        if trouble is not None:
            loss, grad = trouble(i, loss, grad)
        lr = 3e-4 * min(1.0, (i + 1) / warm) * (0.55 + 0.45 * math.cos(math.pi * t)) if warmup else None
        yield StepRecord(ts=float(i), step=i + 1, loss=loss, grad_norm=grad, lr=lr)


def severe(anomalies: list[Anomaly]) -> list[tuple[str, int]]:
    return [(a.kind, a.start_step) for a in anomalies if a.severity != "info"]


LENGTHS = [100, 3000, pytest.param(100_000, marks=pytest.mark.slow)]


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("sigma", [0.005, 0.03])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_long_healthy_curve_raises_nothing(shape: str, sigma: float, n: int) -> None:
    assert severe(detect(run(shape, n, sigma, seed=1))) == []


@pytest.mark.parametrize("n", [3000, pytest.param(100_000, marks=pytest.mark.slow)])
@pytest.mark.parametrize("shape", ["power_law", "converged"])
def test_a_long_healthy_curve_without_an_lr_raises_nothing(shape: str, n: int) -> None:
    # Nothing says when the warm-up ends: the loss alone must do. Curves that fall from their start.
    assert severe(detect(run(shape, n, 0.03, seed=2, warmup=0.0))) == []


@pytest.mark.xfail(
    strict=True,
    reason="from the loss alone, the first thousand steps of a curve falling 0.4% per thousand steps "
    "under 3% noise are flat (the fit bounds the change to within 1.2%, flatter than real no-learning "
    "runs such as a 5%-noise loss flat over 100 logged points): 'no learning since the start' is raised "
    "at step 201 and resolved once the decline shows (step ~1,900). A logged LR warm-up defers it; "
    "without one, only the run's length would, and that is not known while it runs",
)
def test_a_slow_exponential_without_an_lr_raises_no_plateau() -> None:
    assert severe(detect(run("exponential", 100_000, 0.03, seed=1, warmup=0.0))) == []


def _at(n: int) -> int:
    return int(0.7 * n)


def _spike(n: int) -> Callable[[int, float, float], tuple[float, float]]:
    return lambda i, loss, g: (loss * 3.0 if i == _at(n) else loss, g)


def _climb(n: int) -> Callable[[int, float, float], tuple[float, float]]:
    return lambda i, loss, g: (loss * 3.0 ** min(1.0, max(0, i - _at(n)) / 50), g)


def _swing(n: int) -> Callable[[int, float, float], tuple[float, float]]:
    return lambda i, loss, g: (
        loss * math.exp(0.25 * math.sin(2 * math.pi * i / 8)) if i >= _at(n) else loss,
        g,
    )


def _grad_spike(n: int) -> Callable[[int, float, float], tuple[float, float]]:
    return lambda i, loss, g: (loss, g * 30.0 if i == _at(n) else g)


def _nan(n: int) -> Callable[[int, float, float], tuple[float, float]]:
    return lambda i, loss, g: (math.nan if i == _at(n) else loss, g)


def _zero(n: int) -> Callable[[int, float, float], tuple[float, float]]:
    return lambda i, loss, g: (0.0 if i >= _at(n) else loss, g)


TROUBLE = {
    "loss_spike": (_spike, {"loss_spike"}, 1),
    "divergence": (_climb, {"divergence", "loss_spike"}, 60),
    "oscillation": (_swing, {"oscillation"}, 200),
    "grad_spike": (_grad_spike, {"grad_spike", "grad_explosion"}, 1),
    "nan_loss": (_nan, {"nan_loss"}, 0),
    "loss_collapse": (_zero, {"loss_collapse"}, 0),
}


@pytest.mark.parametrize("n", [3000, pytest.param(100_000, marks=pytest.mark.slow)])
@pytest.mark.parametrize("shape", ["power_law", "linear"])
@pytest.mark.parametrize("kind", list(TROUBLE))
def test_trouble_late_in_a_long_run_is_found(kind: str, shape: str, n: int) -> None:
    make, accept, within = TROUBLE[kind]
    got = severe(detect(run(shape, n, 0.01, seed=3, trouble=make(n))))
    start = _at(n) + 1
    found = [(k, s) for k, s in got if k in accept and start <= s <= start + within]
    assert found, got
    assert [(k, s) for k, s in got if s < start] == []  # nothing before the trouble


@pytest.mark.parametrize("n", [300, 3000, pytest.param(100_000, marks=pytest.mark.slow)])
def test_a_run_that_never_learns_is_a_plateau_at_any_length(n: int) -> None:
    flat = run(
        "linear", n, 0.01, seed=4, trouble=lambda i, loss, g: (3.0 * loss / (4.0 * (1 - 0.3 * i / n)), g)
    )
    got = severe(detect(flat))
    assert [k for k, _s in got] == ["plateau"]
