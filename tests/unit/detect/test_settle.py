"""A loss that steps up and holds its new height is one episode; a further climb is still told.

The shape: a healthy curve, then one step up (a spike, then a divergence, both told), held
at the new height with a single point back at the old level soon after (the step's episode
may end there, with the loss still up), and later something on top of the held level. The
step is sized under the divergence threshold above the best level, so only the step's own
alarm tells of it; a block a little under the spike size on top of it is no new trouble,
while a further climb of a whole divergence threshold is.
"""

from __future__ import annotations

import math

import pytest

from steadytune.config.detect import LossConfig
from steadytune.detect import LiveDetector
from tests.unit.detect import shapes
from tests.unit.detect.helpers import feed, raised, records

_LOSS = LossConfig()
# The grid's noise 0.1 is left out: a step large enough to be a spike in it (7 noise units,
# 2x) is past the divergence threshold above the best level, so its held level is a
# divergence by itself and nothing is left to settle.
_GRID = shapes.grid(noises=(0.005, 0.03), lengths=(120, 1200))


def _held_step(scale: float, noise: float, length: int, seed: int, then: float) -> tuple[list[float], int]:
    """(losses, index of the step): ``length`` healthy points, a held step, ``then`` (log) on it from +300."""
    before = shapes.learning(length, scale, noise, seed, fall=0.3)
    rng = shapes.rng_for(seed, "after")
    sigma = max(noise, _LOSS.noise_floor)
    # Under the divergence threshold above the best level (divergence_rise + spike_z/2 sigmas).
    step = _LOSS.divergence_rise + 0.5 * _LOSS.spike_z * sigma - 0.06
    after = [before[-1] * math.exp(step + rng.gauss(0.0, noise)) for _ in range(400)]
    after[10] = before[-1] * math.exp(rng.gauss(0.0, noise))  # one point back at the old level
    for i in range(300, 400 if then > 0.5 else 330):
        after[i] *= math.exp(then)
    return before + after, length


def _spike_size(noise: float) -> float:
    return max(_LOSS.spike_z * max(noise, _LOSS.noise_floor), math.log(_LOSS.spike_min_ratio))


@pytest.mark.parametrize(shapes.GRID, _GRID)
def test_a_held_step_is_told_once(scale: float, noise: float, length: int, seed: int) -> None:
    # A block of 30 points a little under the spike size on the held level: told neither as a
    # spike nor as the step once more (measured from the best level before the step).
    losses, at = _held_step(scale, noise, length, seed, then=0.9 * _spike_size(noise))
    # (The point back at the old level and the return from it may read as an oscillation: a
    # rule of its own, not what is asserted here.)
    got = [a for a in raised(feed(records(losses))) if a.kind != "oscillation"]
    assert [a.kind for a in got] == ["loss_spike", "divergence"]
    assert all(at < a.start_step <= at + 6 for a in got)


@pytest.mark.parametrize(shapes.GRID, _GRID)
def test_a_climb_on_a_held_step_is_still_told(scale: float, noise: float, length: int, seed: int) -> None:
    # The held level climbs on by a whole divergence threshold and stays there: the run ends
    # diverged, whether the step's episode was still open or ended and a new one was raised.
    rise = _LOSS.divergence_rise + _LOSS.spike_z * max(noise, _LOSS.noise_floor)
    losses, _ = _held_step(scale, noise, length, seed, then=rise)
    det = LiveDetector()
    for rec in records(losses):
        det.observe_step(rec)
    still = [a for a in det.open_anomalies() if a.kind in ("loss_spike", "divergence")]
    assert still, "the loss ends a divergence threshold above its held step and nothing is open"
