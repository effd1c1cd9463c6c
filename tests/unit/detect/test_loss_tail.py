"""A per-step loss's own tail of one-batch excursions: news at first, then the run's texture.

Generated shapes only (``shapes.batch_tail``): a learning curve over the scales and noises,
hundreds to thousands of points long, with a hard batch every ~50 points.
"""

from __future__ import annotations

import math

import pytest

from steadytune.detect import LiveDetector
from tests.unit.detect import shapes
from tests.unit.detect.helpers import feed, raised, records

TAIL = shapes.grid(noises=(0.005, 0.03, 0.1), lengths=(600, 2000))


@pytest.mark.parametrize(shapes.GRID, TAIL)
def test_one_batch_excursions_that_keep_coming_back_are_raised_only_until_two_have_passed(
    scale: float, noise: float, length: int, seed: int
) -> None:
    losses, at = shapes.batch_tail(length, scale, noise, seed, every=50)
    assert len(at) >= 4  # enough repeats for the test to mean something
    got = raised(feed(records(losses)))
    steps = {i + 1 for i in at}
    assert all(a.kind == "loss_spike" and a.start_step in steps for a in got)
    # The first two of a size are news; after them a record-breaking one now and then, never each one.
    assert len(got) <= 3


@pytest.mark.parametrize(shapes.GRID, shapes.grid(noises=(0.005, 0.03), lengths=(600, 2000)))
def test_after_the_tail_is_known_a_jump_of_its_size_that_stays_up_is_still_a_spike(
    scale: float, noise: float, length: int, seed: int
) -> None:
    start = length - 30
    losses, _ = shapes.batch_tail(length, scale, noise, seed, every=50, until=start - 10)
    up = math.exp(shapes.tail_jump(noise) * 1.05)
    for i in range(start, min(start + 3, length)):
        losses[i] *= up
    fired = [t.fired for t in feed(records(losses)) if t.state in ("raised", "recurred")]
    # Held for the point after it, which is still up: a spike dated at the jump, raised one point late.
    assert ("loss_spike", start + 1) in [(a.kind, a.start_step) for a in fired]


@pytest.mark.parametrize(shapes.GRID, shapes.grid(noises=(0.005, 0.03), lengths=(600, 2000)))
def test_after_the_tail_is_known_a_one_point_jump_well_past_it_is_raised_at_its_own_step(
    scale: float, noise: float, length: int, seed: int
) -> None:
    spike = length - 30
    losses, _ = shapes.batch_tail(length, scale, noise, seed, every=50, until=spike - 10)
    losses[spike] *= math.exp(2.0 * shapes.tail_jump(noise))
    det = LiveDetector()
    raised_at = None
    for rec in records(losses):
        for t in det.observe_step(rec):
            if t.state in ("raised", "recurred") and t.fired.start_step == spike + 1:
                raised_at = rec.step
    assert raised_at == spike + 1
