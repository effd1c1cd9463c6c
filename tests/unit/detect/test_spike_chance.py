"""A one-point spike judged against the run's own tail over its length (``SpikeChance``).

Generated curves only (``long_curves.py``): healthy shapes whose noise has fat tails (one point in ten
``wide`` times as wide), up to 100,000 points. A fixed 7 noise units is passed by chance ever more often
as the log grows; the run's tail of exceedances of a lower level says how far its noise reaches over the
points so far.
"""

from __future__ import annotations

import random

import pytest

from steadytune.detect import detect
from steadytune.detect.loss_rules import SpikeChance
from tests.unit.detect.long_curves import at, run, severe

UNIT = 0.04  # a noise unit (log)
SMALL = 0.0953  # log 1.1, the smallest jump


def _sampled(k: int, beta: float, seed: int) -> SpikeChance:
    """A tail of ``k`` exceedances of the lower level, exponential with mean excess ``beta`` units."""
    chance, rng = SpikeChance(), random.Random(seed)
    for _ in range(k):
        chance.note(SpikeChance.lower(UNIT, SMALL) + UNIT * rng.expovariate(1.0 / beta), UNIT, SMALL)
    return chance


def test_a_short_tail_leaves_the_fixed_threshold_alone() -> None:
    # Under 30 exceedances nothing is extrapolated: a short run is judged at spike_z as before.
    assert _sampled(29, 0.5, seed=1).threshold(UNIT, SMALL) == 0.0


def test_points_below_the_lower_level_are_not_the_tail() -> None:
    chance = SpikeChance()
    for _ in range(1000):
        chance.note(3.9 * UNIT, UNIT, SMALL)
    assert chance.k == 0


@pytest.mark.parametrize("seed", range(3))
def test_the_threshold_grows_with_the_tail_and_noise_rarely_passes_it(seed: int) -> None:
    short, long_ = _sampled(100, 0.5, seed), _sampled(10_000, 0.5, seed)
    assert long_.threshold(UNIT, SMALL) > short.threshold(UNIT, SMALL) > 7 * UNIT
    # Over the next 10,000 exceedances of the same tail, noise passes the long tail's threshold
    # about 1% of the time (the chance it is set at), never in a few runs.
    rng = random.Random(100 + seed)
    thr = long_.threshold(UNIT, SMALL)
    low = SpikeChance.lower(UNIT, SMALL)
    assert not any(low + UNIT * rng.expovariate(2.0) > thr for _ in range(10_000))


# The fatter tail (one point in ten three times as wide) passes 7 units by chance every few
# tens of thousands of points; past the first 10,000 the run's tail has shown it.
HEALTHY = [("power_law", 0.1), ("linear", 0.03)]


@pytest.mark.slow
@pytest.mark.parametrize(("shape", "sigma"), HEALTHY)
def test_a_long_fat_tailed_curve_raises_no_chance_spike_once_its_tail_is_known(
    shape: str, sigma: float
) -> None:
    got = severe(detect(run(shape, 100_000, sigma, seed=1, wide=3.0)))
    assert [(kind, step) for kind, step in got if step > 10_000] == []


@pytest.mark.slow
@pytest.mark.parametrize("ratio", [2.0, 3.0])
@pytest.mark.parametrize(("shape", "sigma", "wide"), [("linear", 0.03, 3.0), ("power_law", 0.03, 2.0)])
def test_a_real_spike_late_in_a_long_curve_is_still_raised_at_its_step(
    shape: str, sigma: float, wide: float, ratio: float
) -> None:
    n = 100_000
    trouble = lambda i, loss, g: (loss * ratio if i == at(n) else loss, g)  # noqa: E731
    got = severe(detect(run(shape, n, sigma, seed=1, wide=wide, trouble=trouble)))
    assert [(kind, step) for kind, step in got if step > 10_000] == [("loss_spike", at(n) + 1)]
