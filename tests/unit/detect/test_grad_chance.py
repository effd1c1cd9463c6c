"""A one-point grad-norm spike judged against the run's own largest jumps (``GradChance``).

Generated series only: log-normal norms over lengths of 100 to 3,000 logged points (the 100,000-point
curves are in ``test_long_runs.py``, 1M and 10M in ``benchmarks/long_runs.py``), log noise 2-10 % (a
quiet QLoRA or pretraining norm) and 20-35 % with one batch in a hundred 1.5-3x up (a fat-tailed one),
norms from 0.01 to 100.
"""

from __future__ import annotations

import math
import random

import pytest

from steadytune.detect.grad_tail import GradChance
from tests.unit.detect import shapes
from tests.unit.detect.helpers import feed, raised, records

PRIOR = math.log(8.0)  # the prior ratio's jump (grad.spike_min_ratio)


def _tail(n: int, sigma: float, seed: int) -> GradChance:
    """The jumps of ``n`` Gaussian log norms over their level (sigma ``sigma``)."""
    chance, rng = GradChance(), random.Random(seed)
    for _ in range(n):
        chance.note(rng.gauss(0.0, sigma))
    return chance


def test_a_run_too_short_to_show_its_tail_keeps_the_prior() -> None:
    assert _tail(30, 0.1, seed=1).threshold(PRIOR) is None
    assert _tail(31, 0.1, seed=1).threshold(PRIOR) is not None


@pytest.mark.parametrize("sigma", [0.03, 0.1])
def test_a_quiet_run_asks_a_few_of_its_sigmas_and_noise_rarely_passes_them(sigma: float) -> None:
    # 3,000 points of Gaussian noise ask 4-6 of their sigmas, far under the prior's 8x; the next
    # 3,000 points of the same noise pass that in a few runs out of a hundred (the exponential
    # through 30 top jumps is a rough reading of a tail: the z-score and the floor stand beside it).
    passed = 0
    for seed in range(20):
        thr = _tail(3000, sigma, seed).threshold(PRIOR)
        assert thr is not None and 3.5 * sigma < thr < 8 * sigma < PRIOR
        rng = random.Random(100 + seed)
        passed += max(rng.gauss(0.0, sigma) for _ in range(3000)) > thr
    assert passed <= 3


def test_a_fat_tail_never_asks_more_than_the_prior_until_the_run_is_long() -> None:
    # One point in ten jumps by an exponential of mean 0.3 (log): 3x batches are common and the
    # exponential through the largest puts chance far past 8x, but a crowd of big batches does not
    # make a 10x one ordinary, so the prior ratio holds...
    rng, chance = random.Random(3), GradChance()
    for _ in range(50_000):
        chance.note(rng.expovariate(1.0 / 0.3) if rng.random() < 0.1 else rng.gauss(0.0, 0.1))
    assert chance.threshold(PRIOR) == pytest.approx(PRIOR)
    # ... until the run is longer than the prior was chosen on: then it grows with the run's length.
    for _ in range(950_000):
        chance.note(-1.0)  # below every top jump: only the count grows
    grown = chance.threshold(PRIOR)
    assert grown is not None and PRIOR < grown < PRIOR + 1.0


def test_past_the_prior_s_length_a_quiet_tail_no_longer_lowers_the_prior() -> None:
    # 30 top jumps are the far tail of a long run, where they say least: the prior grows, never falls.
    chance = _tail(100_000, 0.03, seed=4)
    short = chance.threshold(PRIOR)
    assert short is not None and short < PRIOR
    for _ in range(900_000):
        chance.note(-1.0)
    grown = chance.threshold(PRIOR)
    assert grown is not None and PRIOR < grown < PRIOR + 0.1


# Quiet norms: lengths, noise and scale; the spike 5-8x the larger of its neighbours at 70 % of the run.
QUIET = [
    pytest.param(n, sigma, level, seed, id=f"n{n}-s{sigma}-g{level}-r{seed}")
    for n in (100, 400, 3000)
    for sigma in (0.02, 0.05, 0.1)
    for level in (0.01, 1.0, 100.0)
    for seed in (0, 1)
]


@pytest.mark.parametrize(("n", "sigma", "level", "seed"), QUIET)
def test_a_5_to_8x_norm_in_a_quiet_run_is_a_grad_spike_at_its_step(
    n: int, sigma: float, level: float, seed: int
) -> None:
    grads = shapes.grad_norms(n, level, sigma, seed)
    rng = shapes.rng_for(seed, "quiet-jump")
    at = int(0.7 * n)
    grads[at] = rng.uniform(5.0, 8.0) * max(grads[at - 1], grads[at + 1])
    got = [
        a
        for a in raised(feed(records(shapes.learning(n, 2.0, 0.03, seed), grads)))
        if a.kind.startswith("grad_")
    ]
    assert [(a.kind, a.start_step) for a in got] == [("grad_spike", at + 1)]
    assert got[0].evidence["threshold_ratio"] < 5.0


@pytest.mark.parametrize(("n", "sigma", "level", "seed"), QUIET)
def test_a_quiet_healthy_run_raises_no_grad_alarm(n: int, sigma: float, level: float, seed: int) -> None:
    grads = shapes.grad_norms(n, level, sigma, seed)
    got = raised(feed(records(shapes.learning(n, 2.0, 0.03, seed), grads)))
    assert not [a for a in got if a.kind.startswith("grad_")], [(a.kind, a.start_step) for a in got]


# Fat-tailed norms (one batch in a hundred 1.5-3x up, over 20-35 % noise): its largest jumps are its own.
FAT = [
    pytest.param(n, sigma, level, seed, id=f"n{n}-s{sigma}-g{level}-r{seed}")
    for n in (400, 3000)
    for sigma in (0.2, 0.35)
    for level in (0.01, 100.0)
    for seed in (0, 1, 2)
]


@pytest.mark.parametrize(("n", "sigma", "level", "seed"), FAT)
def test_a_fat_tailed_healthy_run_raises_no_grad_alarm(n: int, sigma: float, level: float, seed: int) -> None:
    grads = shapes.warmup_grad_norms(n, level, sigma, seed, 2)
    got = raised(feed(records(shapes.learning(n, 2.0, 0.03, seed), grads)))
    assert not [a for a in got if a.kind.startswith("grad_")], [(a.kind, a.start_step) for a in got]


@pytest.mark.parametrize(("n", "sigma", "level", "seed"), FAT)
def test_a_fat_tailed_run_still_has_a_30x_norm_raised_at_its_step(
    n: int, sigma: float, level: float, seed: int
) -> None:
    grads = shapes.warmup_grad_norms(n, level, sigma, seed, 2)
    at = int(0.7 * n)
    grads[at] = 30.0 * max(grads[at - 1], grads[at + 1])
    got = [
        a
        for a in raised(feed(records(shapes.learning(n, 2.0, 0.03, seed), grads)))
        if a.kind.startswith("grad_")
    ]
    assert [(a.kind, a.start_step) for a in got][:1] == [("grad_spike", at + 1)]


# Short and early runs: a norm judged against its two neighbours, with a prior. Lengths of 30-99 logged
# points, quiet norms (2-5 % log noise) falling from 5x over a warm-up of 0 or 25 % of the run (the LR
# rising over it), norms from 0.01 to 100; the jump is 5-8x the larger of its neighbours, from the
# twentieth point on, inside the warm-up or after it. Before that the warm-up's fall is in the measured
# noise (a fall of 8x over four points takes some fifteen to leave the recent differences), and the
# prior's 8x holds.
SHORT_QUIET = [
    pytest.param(n, sigma, warm, level, seed, id=f"n{n}-s{sigma}-w{warm}-g{level}-r{seed}")
    for n in (30, 60, 99)
    for sigma in (0.02, 0.05)
    for warm in (0.0, 0.25)
    for level in (0.01, 100.0)
    for seed in (0, 1, 2)
]


@pytest.mark.parametrize(("n", "sigma", "warm", "level", "seed"), SHORT_QUIET)
def test_a_5_to_8x_norm_early_in_a_quiet_run_is_a_grad_spike(
    n: int, sigma: float, warm: float, level: float, seed: int
) -> None:
    losses, grads, lr = shapes.short_warm_run(n, sigma, warm, level, seed)
    rng = shapes.rng_for(seed, "early-quiet-jump")
    at = rng.randint(19, n - 2)
    grads[at] = rng.uniform(5.0, 8.0) * max(grads[at - 1], grads[at + 1])
    got = [a for a in raised(feed(records(losses, grads, lr=lr))) if a.kind.startswith("grad_")]
    assert [(a.kind, a.start_step) for a in got][:1] == [("grad_spike", at + 1)], [
        (a.kind, a.start_step) for a in got
    ]


@pytest.mark.parametrize(("n", "sigma", "warm", "level", "seed"), SHORT_QUIET)
def test_a_short_quiet_healthy_run_raises_no_grad_alarm(
    n: int, sigma: float, warm: float, level: float, seed: int
) -> None:
    losses, grads, lr = shapes.short_warm_run(n, sigma, warm, level, seed)
    got = raised(feed(records(losses, grads, lr=lr)))
    assert not [a for a in got if a.kind.startswith("grad_")], [(a.kind, a.start_step) for a in got]
