"""A detector's ``needs``: the engine leaves it out of points without them, so it must have nothing
to do with such a point (no finding, no change of state)."""

from __future__ import annotations

import math
import pickle
import random

import pytest

from steadytune.config.detect import DetectConfig
from steadytune.detect import build
from steadytune.detect.base import NEEDS, Finding
from steadytune.detect.points import Signal
from steadytune.detect.stats import SeriesLimits
from steadytune.objectives import LOSS_OBJECTIVE, objective_of
from steadytune.records import StepRecord

RL = objective_of({"reward": 1.0, "kl": 0.1})
WITH_NEEDS = [name for name, d in build.run_detectors(DetectConfig()).items() if getattr(d, "needs", ())]


def _point(step: int, rng: random.Random, lacking: str | None) -> Signal:
    """A point with all of NEEDS but ``lacking``, with values that move."""
    extra = {"reward": rng.random(), "kl": 0.05 + rng.random() / 10, "clip_ratio": rng.random() / 4}
    rec = StepRecord(
        step=step,
        ts=0.0 if lacking == "ts" else 1000.0 + step,
        loss=2.0 * math.exp(-step / 300) * (1 + rng.gauss(0, 0.05)),
        grad_norm=1.0 + rng.random(),
        eval_loss=None if lacking == "eval_loss" else 2.0 + step / 100,
        extra={} if lacking == "extra" else extra,
    )
    objective = rng.choice([None, LOSS_OBJECTIVE]) if lacking == "own_objective" else RL
    tracker = SeriesLimits(8, 64, 3.0, 0.05, 1.0, 1e-3, 6.0, 1.5).tracker()
    for y in (0.5, 0.52, 0.49):
        tracker.accept(y)
    return Signal(rec, objective, False, tracker)


def test_every_need_named_is_one_the_engine_knows() -> None:
    for name in WITH_NEEDS:
        d = build.run_detectors(DetectConfig())[name]
        assert set(d.needs) <= set(NEEDS), name  # type: ignore[attr-defined]
    assert WITH_NEEDS  # the mechanism is in use


@pytest.mark.parametrize("name", WITH_NEEDS)
def test_a_detector_has_nothing_to_do_with_a_point_that_lacks_what_it_needs(name: str) -> None:
    rng = random.Random(5)
    d = build.run_detectors(DetectConfig())[name]
    out: list[Finding] = []
    for step in range(1, 60):  # a history first, with everything
        d.observe(_point(step, rng, None), out)
    for need in d.needs:  # type: ignore[attr-defined]
        for step in range(60, 90):
            before = pickle.dumps(d)
            found: list[Finding] = []
            d.observe(_point(step, rng, need), found)
            assert found == [] and pickle.dumps(d) == before, (name, need, step)
