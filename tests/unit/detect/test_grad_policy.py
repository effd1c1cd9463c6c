"""A gradient-norm bump of an RL run that the policy's KL or entropy confirms (detect/grad_policy.py).

GENERATED GRPO runs (detect/synthetic_rl.py) over length, group size and seed: a bump of a few
rollout batches, each 2.5-5x the norm's level with the KL or the entropy moved at the same points,
is a ``grad_spike`` dated inside it; the same bump in the norm alone, or in the policy's signals
alone, is not this rule's; healthy runs raise nothing.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest

from steadytune.detect.grad_policy import PolicyBump
from steadytune.records import StepRecord
from tests.unit.detect import shapes
from tests.unit.detect.helpers import feed, raised, records

LENGTHS = (80, 300, 3000)
# Log-space noise per point of the norm and of the KL (the entropy moves less: a quarter of the KL's).
NOISE = ((0.1, 0.1), (0.2, 0.2), (0.3, 0.2))


Run = tuple[list[float], list[float], list[dict[str, Any]], list[tuple[float, float, float]]]


def _run(n: int, seed: int, noise: tuple[float, float]) -> Run:
    """A GRPO run: a rising reward, a norm around its level, a KL growing from 0, a drifting entropy.

    Returns the losses, norms and logged fields, and each point's levels (norm, KL, entropy).
    """
    rng = shapes.rng_for(seed, f"policy-bump-{n}-{noise}")
    sg, sk = noise
    g0, kl_end = rng.uniform(0.05, 2.0), rng.uniform(0.005, 0.2)
    ent0, ent_end = rng.uniform(0.2, 1.5), rng.uniform(0.4, 1.2)
    tau = rng.uniform(0.1, 0.5) * n
    losses, grads, extra, levels = [], [], [], []
    for i in range(n):
        t = 1 - math.exp(-i / tau)
        kl, entropy = max(1e-5, kl_end * (1 - math.exp(-i / (0.15 * n)))), ent0 * (1 + (ent_end - 1) * t)
        losses.append(rng.gauss(0.0, 0.01))
        grads.append(g0 * math.exp(rng.gauss(0.0, sg)))
        extra.append(
            {
                "reward": min(1.0, max(0.0, 0.3 + 0.4 * t + rng.gauss(0.0, 0.05))),
                "kl": kl * math.exp(rng.gauss(0.0, sk)),
                "entropy": entropy * math.exp(rng.gauss(0.0, sk / 4)),
            }
        )
        levels.append((g0, kl, entropy))
    return losses, grads, extra, levels


def _bumped(
    n: int, seed: int, noise: tuple[float, float], width: int, grad: float, kl: float, entropy: float
) -> tuple[list[StepRecord], int]:
    """The run with ``width`` points from 60 % of it moved: norm to ``grad`` times its level, KL and entropy
    to theirs (a factor 1 leaves that series' noisy points as they were)."""
    losses, grads, extra, levels = _run(n, seed, noise)
    at = int(0.6 * n)
    for i in range(at, at + width):
        g0, kl0, ent0 = levels[i]
        grads[i] = g0 * grad if grad != 1.0 else grads[i]
        extra[i]["kl"] = kl0 * kl if kl != 1.0 else extra[i]["kl"]
        extra[i]["entropy"] = ent0 * entropy if entropy != 1.0 else extra[i]["entropy"]
    return records(losses, grads, extra=extra), at + 1  # records() counts steps from 1


def _grad_spikes(recs: list[StepRecord]) -> list[tuple[int, str]]:
    return [
        (a.start_step, str(a.evidence.get("judged_by", "")))
        for a in raised(feed(recs))
        if a.kind == "grad_spike"
    ]


CASES = list(itertools.product(LENGTHS, NOISE))


def _size(sigma: float) -> float:
    """A move six of the series' noise units up: clear of its noise, about the one-point rules' bar."""
    return math.exp(max(math.log(2.5), 6.0 * sigma))


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("n, noise", CASES)
@pytest.mark.parametrize("width, kl, entropy", [(3, True, False), (4, False, True), (6, True, True)])
def test_a_bump_the_policy_confirms_is_a_grad_spike_inside_it(
    n: int, seed: int, noise: tuple[float, float], width: int, kl: bool, entropy: bool
) -> None:
    grad, kl_by = _size(noise[0]), _size(noise[1]) if kl else 1.0
    recs, start = _bumped(n, seed, noise, width, grad, kl_by, 2.0 if entropy else 1.0)
    spikes = _grad_spikes(recs)
    assert spikes, "the bump was not told"
    assert all(start <= s < start + width for s, _ in spikes), spikes


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("n, noise", CASES)
def test_a_healthy_run_and_a_policy_shift_alone_raise_no_grad_spike(
    n: int, seed: int, noise: tuple[float, float]
) -> None:
    losses, grads, extra, _ = _run(n, seed, noise)
    assert _grad_spikes(records(losses, grads, extra=extra)) == []
    # The KL and the entropy moving with the norm steady: the policy's own business, not the norm's.
    recs, _ = _bumped(n, seed, noise, 4, 1.0, 3.0, 2.0)
    assert _grad_spikes(recs) == []


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("n, noise", CASES)
def test_a_norm_bump_with_a_steady_policy_is_not_this_rules(
    n: int, seed: int, noise: tuple[float, float]
) -> None:
    recs, _ = _bumped(n, seed, noise, 4, 3.0, 1.0, 1.0)
    assert [s for s in _grad_spikes(recs) if s[1] == "policy"] == []


def test_the_first_points_of_a_kl_are_no_yardstick() -> None:
    """The KL climbs from 0 by design: doubling with the norm in the first two level windows is not judged."""
    bump = PolicyBump(level_window=8, noise_window=64, gap_factor=6.0)
    told = [bump.observe(i, {"kl": 1e-4 * 2.0**i}, 3.0) for i in range(1, 16)]
    assert not any(told)


def test_three_points_of_one_bump_must_see_the_policy_move() -> None:
    bump = PolicyBump(level_window=8, noise_window=64, gap_factor=6.0)
    steady = [bump.observe(i, {"kl": 0.1 * (1.0 + 0.02 * (i % 3))}, None) for i in range(1, 41)]
    assert not any(steady)
    assert not bump.observe(41, {"kl": 0.25}, 3.0)
    assert not bump.observe(42, {"kl": 0.26}, 3.0)
    assert not bump.observe(43, {"kl": 0.25}, None)  # the norm came back: that bump is over
    assert not bump.observe(44, {"kl": 0.25}, 3.0)
    assert not bump.observe(45, {"kl": 0.1}, 3.0)  # the policy did not move at this one
    assert not bump.observe(46, {"kl": 0.26}, 3.0)
    assert bump.observe(47, {"kl": 0.27}, 3.0)
    assert [p[0] for p in bump.run] == [44, 45, 46, 47]
    assert bump.confirmed == 3
