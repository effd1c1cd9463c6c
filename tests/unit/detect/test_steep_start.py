"""Spikes during a steep fall (the first hundreds of steps, a warm-up) on generated starts.

While the loss falls fast, every successive difference carries the slope and the recent
level lags behind the curve: a clear one-point spike would be judged against a noise made
of the fall and from a level points behind it. Healthy steep starts must stay silent.
"""

from __future__ import annotations

import math
import random

import pytest

from tests.unit.detect.helpers import feed, raised, records

SHAPES = ("exp", "power")
TAUS = (20, 40, 80)  # points over which the fall slows by e (exp) or the power law's knee


def steep_start(n: int, shape: str, tau: int, noise: float, seed: int, scale: float = 3.0) -> list[float]:
    """A loss falling from ``scale`` to a fifth of it, fast at first, with log-normal noise ``noise``."""
    rng = random.Random(f"steep:{seed}")
    out = []
    for i in range(n):
        left = math.exp(-i / tau) if shape == "exp" else (1.0 + i / tau) ** -1.5
        out.append(scale * (0.2 + 0.8 * left) * math.exp(rng.gauss(0.0, noise)))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("noise", [0.005, 0.02, 0.05, 0.1])
@pytest.mark.parametrize("tau", TAUS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale", [0.5, 11.0])
def test_a_healthy_steep_start_raises_nothing(
    scale: float, shape: str, tau: int, noise: float, seed: int
) -> None:
    assert raised(feed(records(steep_start(400, shape, tau, noise, seed, scale)))) == []


# The spike lies 20-28 points in, where the fall is at its steepest that a level window allows
# (a run 20 points old has 1-2 % a point still to fall at tau 20-40). 1.4x at 1 % noise is 34 noise
# sigmas, yet a quarter of these were missed when the fall counted as noise.
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("ratio", [1.4, 2.0])
@pytest.mark.parametrize("noise", [0.005, 0.01])
@pytest.mark.parametrize("tau", TAUS)
@pytest.mark.parametrize("shape", SHAPES)
def test_a_one_point_spike_in_a_steep_fall_is_a_spike_at_its_step(
    shape: str, tau: int, noise: float, ratio: float, seed: int
) -> None:
    losses = steep_start(300, shape, tau, noise, seed)
    at = 20 + 4 * seed
    losses[at] *= ratio
    got = raised(feed(records(losses)))
    assert [(a.kind, a.start_step) for a in got] == [("loss_spike", at + 1)]
