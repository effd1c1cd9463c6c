"""A NaN loss that ended a climb is told as the divergence it was (detect/nan_climb.py).

GENERATED curves (tests/unit/detect/shapes.py) over scale, noise and the climb's length and speed:
a healthy start, a climb of a few points, then NaN: a ``divergence`` dated at the climb's first
point (or from the lowest point before it) and the ``nan_loss``. Healthy curves that end in a
NaN raise a divergence no more often than the one-sided 5 % test allows.
"""

from __future__ import annotations

import math

import pytest

from steadytune.detect.nan_climb import climb_before_nan
from steadytune.records import Anomaly
from tests.unit.detect import shapes
from tests.unit.detect.helpers import feed, raised, records


def _alarms(losses: list[float]) -> list[Anomaly]:
    return raised(feed(records(losses)))


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("scale", shapes.SCALES)
@pytest.mark.parametrize(
    "noise, points, double_in",
    [(0.005, 5, 12.0), (0.005, 10, 30.0), (0.03, 6, 6.0), (0.03, 10, 12.0), (0.1, 10, 4.0)],
)
@pytest.mark.parametrize("before", [8, 120])
def test_a_climb_that_ends_in_nan_is_a_divergence_from_its_start(
    seed: int, scale: float, noise: float, points: int, double_in: float, before: int
) -> None:
    losses = [*shapes.climb(before, points, scale, noise, seed, double_in), math.nan]
    got = _alarms(losses)
    nan_step = len(losses)  # records() counts steps from 1
    first_climb = before + 1
    assert [(a.kind, a.start_step) for a in got if a.kind == "nan_loss"] == [("nan_loss", nan_step)]
    # Dated at the climb, or from the lowest point of the two level windows before the NaN, which
    # noise may put a few points before it (where the climb is steep enough for the rules that
    # judge as it happens, they tell it first, as before).
    div = [a.start_step for a in got if a.kind == "divergence" and first_climb - 8 <= a.start_step < nan_step]
    assert div, [(a.kind, a.start_step) for a in got]


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("scale", shapes.SCALES)
@pytest.mark.parametrize("n", [12, 120, 1200])
def test_a_quiet_healthy_run_that_turns_nan_is_only_a_nan(seed: int, scale: float, n: int) -> None:
    losses = [*shapes.learning(n, scale, 0.005, seed), math.nan]
    assert [a.kind for a in _alarms(losses)] == ["nan_loss"]


@pytest.mark.parametrize("noise", [0.03, 0.1, 0.3])
@pytest.mark.parametrize("shape", ["learning", "flat"])
def test_a_noisy_healthy_run_that_turns_nan_is_rarely_read_as_a_climb(shape: str, noise: float) -> None:
    """The look back is one test at the one-sided 5 % level: healthy runs pass it no more often."""
    runs = 200
    told = 0
    for seed in range(runs):
        losses = [*getattr(shapes, shape)(40, 2.0, noise, seed), math.nan]
        told += any(a.kind == "divergence" for a in _alarms(losses))
    assert told <= 0.05 * runs, told


def test_the_low_is_left_out_of_the_line() -> None:
    """A low chosen as the lowest tilts a line through it upwards: four flat points after it are no climb."""
    low = [(1, 0.0), (2, -0.3), (3, 0.2), (4, 0.21), (5, 0.19), (6, 0.2)]
    assert climb_before_nan(low, 0.1) is None
    climbing = [(1, 0.0), (2, -0.3), (3, 0.0), (4, 0.05), (5, 0.1), (6, 0.16)]
    ev = climb_before_nan(climbing, 0.1)
    assert ev is not None and ev["start_step"] == 3 and ev["low_step"] == 2


def test_a_rise_under_the_least_is_no_climb() -> None:
    steady = [(i, 0.01 * i) for i in range(1, 9)]  # a perfect line, 1.07x in all
    assert climb_before_nan(steady, 0.1) is None
    assert climb_before_nan([(i, 0.02 * i) for i in range(1, 9)], 0.1) is not None
