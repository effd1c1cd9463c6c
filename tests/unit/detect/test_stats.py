"""The incremental statistics under the detectors."""

from __future__ import annotations

import math
import random

import pytest

from steadytune.detect.stats import Seasonal, SortedWindow, Tracker


def test_sorted_window_median_and_quantile_follow_the_window() -> None:
    w = SortedWindow(3)
    for x in (5.0, 1.0, 3.0, 10.0):
        w.push(x)
    assert list(w.values) == [1.0, 3.0, 10.0] and w.median() == 3.0 and w.quantile(0.0) == 1.0


def _tracker() -> Tracker:
    # Shrinkage is geometric (log space): a prior worth four differences.
    return Tracker(8, 64, prior=0.12, prior_weight=4.0, floor=0.01)


def test_noise_estimate_matches_gaussian_sigma_and_ignores_the_trend() -> None:
    rng = random.Random(0)
    t = _tracker()
    for i in range(400):
        t.begin(i + 1, 6.0)
        t.accept(-0.002 * i + rng.gauss(0, 0.05))
    assert 0.04 < t.sigma < 0.07


def _fed(slope: float, noise: float, n: int = 200) -> Tracker:
    rng = random.Random(3)
    t = _tracker()
    for i in range(n):
        t.begin(i + 1, 6.0)
        t.accept(slope * i + rng.gauss(0, noise))
    return t


def test_a_steep_fall_is_no_noise_but_a_steep_climb_stays_noise() -> None:
    # 3 % a point down with 0.5 % noise: the differences are all slope, the noise is the 0.5 %.
    falling = _fed(-0.03, 0.005)
    assert falling.sigma < 0.015 and falling.falling_slope() < -0.02
    # The level lags 4.5 points behind the fall: the next point is expected that much lower.
    assert falling.fall_ahead == pytest.approx(-0.03 * 4.5, rel=0.15)
    # The same climb keeps its slope in the noise (a diverging loss must not look quiet) and no
    # level is carried up.
    climbing = _fed(0.03, 0.005)
    assert climbing.sigma > 0.02 and climbing.falling_slope() == 0.0 and climbing.fall_ahead == 0.0


@pytest.mark.parametrize("seed", range(5))
def test_a_flat_series_keeps_its_noise_and_has_no_fall(seed: int) -> None:
    rng = random.Random(seed)
    t = _tracker()
    falls = 0
    for i in range(400):
        t.begin(i + 1, 6.0)
        t.accept(rng.gauss(0, 0.05))
        falls += t.fall_ahead < 0.0
    assert 0.04 < t.sigma < 0.07 and falls == 0


def test_prior_dominates_while_few_differences_are_known() -> None:
    t = _tracker()
    for i, y in enumerate((1.0, 1.0, 1.0)):
        t.begin(i + 1, 6.0)
        t.accept(y)
    # Two identical differences of zero must not make the next ordinary point look like a 50-sigma one.
    assert t.sigma > 0.05


def test_gap_many_intervals_long_starts_a_new_segment() -> None:
    t = _tracker()
    for s in range(10, 200, 10):
        assert not t.begin(s, 6.0) or s == 10
        t.accept(1.0)
    assert t.begin(5000, 6.0) and t.n_level == 0
    assert t.begin(100, 6.0)  # a step going back (a restart) too


def test_seasonal_reference_is_last_epochs_level_at_the_same_phase() -> None:
    s = Seasonal()
    for i in range(100):
        s.add(i / 50, math.log(2.0 - i % 50 / 50))  # falls through each epoch
    ref = s.reference(2.0)  # the first point of epoch 2, before it is added
    assert ref is not None and abs(ref - math.log(2.0)) < 0.05
    assert s.reference(5.0) is None


@pytest.mark.parametrize("seed", (0, 1, 2))
@pytest.mark.parametrize("sigma", (0.01, 0.1))
@pytest.mark.parametrize("climb", (3, 8))
@pytest.mark.parametrize("before_n", (40, 200))
def test_restart_segment_takes_the_segments_points_back_out(
    seed: int, sigma: float, climb: int, before_n: int
) -> None:
    rng = random.Random(seed)
    t = _tracker()
    for s in range(1, before_n):
        t.begin(s, 6.0)
        t.accept(rng.gauss(0.0, sigma))
    t.begin(5000, 6.0)  # a new segment: its first point, then a climb
    t.accept(2.0)
    before = t.sigma
    for i in range(climb):
        t.begin(5001 + i, 6.0)
        t.accept(2.0 + 0.5 * (i + 1))
    assert t.sigma > before
    t.restart_segment(2.0)
    assert (t.level, t.n_level, t.last_y) == (2.0, 1, 2.0)
    if before_n + climb < 64:
        assert t.sigma == pytest.approx(before, rel=1e-9)
    else:  # a full noise window lost its oldest differences to the climb's: those are not brought back
        assert t.sigma == pytest.approx(before, rel=0.25)
