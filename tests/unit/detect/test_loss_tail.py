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


# After the tail is known: a jump of its size that stays up (three points) is still a spike, dated at
# the jump and raised one point late (held for the point after it); a one-point jump twice the tail's
# size is past it and raised at its own step.
AFTER = [
    pytest.param(*p.values, points, size, late, id=f"{p.id}-{name}")
    for name, points, size, late in (("stays-up", 3, 1.05, 1), ("past-tail", 1, 2.0, 0))
    for p in shapes.grid(noises=(0.005, 0.03), lengths=(600, 2000))
]


@pytest.mark.parametrize(shapes.GRID + ", points, size, late", AFTER)
def test_after_the_tail_is_known_a_jump_that_stays_up_or_passes_it_is_a_spike(
    scale: float, noise: float, length: int, seed: int, points: int, size: float, late: int
) -> None:
    at = length - 30
    losses, _ = shapes.batch_tail(length, scale, noise, seed, every=50, until=at - 10)
    for i in range(at, at + points):
        losses[i] *= math.exp(size * shapes.tail_jump(noise))
    det = LiveDetector()
    raised_at = None
    for rec in records(losses):
        for t in det.observe_step(rec):
            if (
                t.state in ("raised", "recurred")
                and t.fired.kind == "loss_spike"
                and t.fired.start_step == at + 1
            ):
                raised_at = rec.step
    assert raised_at == at + 1 + late
