"""reward_collapse on SHORT and EARLY RL runs (issue 27, part 6): a reward that falls from its first
batches is told once it clearly stands at its floor, though the best level held only a few points;
healthy short runs (rising, flat and noisy, rising then noisy) over length, group size and reward
raise nothing. All runs are generated (detect/synthetic_rl.py and a flat binomial reward here)."""

from __future__ import annotations

import random
import statistics

import pytest

from steadytune.detect import LiveDetector
from steadytune.detect.synthetic_rl import rl_run
from steadytune.records import Anomaly, StepRecord
from tests.unit.detect import shapes
from tests.unit.detect.helpers import records

# (prompt groups per step, completions per group): a batch of two completions up to 16 x 16.
SMALL = ((1, 2), (1, 4), (2, 8))
# A batch of 64 completions and more: a binary reward of 0.1-0.35 seldom sits at 0 by chance there. A
# batch of 16 often does in its first logs, and a fall to 0 then is not told within a short run.
LARGE = ((4, 16), (16, 16))
SHORT = (8, 12, 20, 30, 45, 60)


def _told(recs: list[StepRecord]) -> list[tuple[int, Anomaly]]:
    """Each reward_collapse raised, with the step it was raised at."""
    det, out = LiveDetector(), []
    for r in recs:
        out += [(r.step, t.anomaly) for t in det.observe_step(r) if t.state == "raised"]
    return [(s, a) for s, a in out if a.kind == "reward_collapse"]


def _grpo(n: int, seed: int, groups: tuple[int, int], graded: bool, **kw: object) -> list[StepRecord]:
    rng = shapes.rng_for(seed, f"rl-short-{n}-{groups}-{graded}-{sorted(kw.items())}")
    losses, grads, extra = rl_run(rng, n, groups=groups[0], group_size=groups[1], graded=graded, **kw)  # type: ignore[arg-type]
    return records(losses, grads, extra=extra)


def _sliding(n: int, seed: int, size: int, p0: float, span: int, hold: int = 0) -> list[StepRecord]:
    """A binary reward, the mean over ``size`` completions, whose chance of a right answer slides from
    ``p0`` to 0 over ``span`` batches, after ``hold`` batches at it, and stays there (a short run)."""
    rng = shapes.rng_for(seed, f"slide-{n}-{size}-{p0}-{span}" + (f"-{hold}" if hold else ""))
    extra = []
    for i in range(n):
        p = p0 * max(0.0, 1 - max(0, i - hold) / span)
        scores = [float(rng.random() < p) for _ in range(size)]
        extra.append({"reward": statistics.fmean(scores), "reward_std": statistics.pstdev(scores)})
    return records([0.0] * n, [0.3] * n, extra=extra)


def _flat(n: int, seed: int, size: int, graded: bool) -> list[StepRecord]:
    """A reward that neither rises nor falls: the mean of ``size`` scores at one chance, batch noise only."""
    rng = random.Random(f"flat-{n}-{size}-{graded}-{seed}")
    p, extra = rng.uniform(0.1, 0.9), []
    for _ in range(n):
        if graded:
            scores = [(rng.random() < p) * 0.5 + (rng.random() < p) * 0.5 for _ in range(size)]
        else:
            scores = [float(rng.random() < p) for _ in range(size)]
        extra.append({"reward": statistics.fmean(scores), "reward_std": statistics.pstdev(scores)})
    return records([0.0] * n, [0.3] * n, extra=extra)


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("n", (30, 60))
@pytest.mark.parametrize("groups", LARGE)
@pytest.mark.parametrize("graded", (False, True))
@pytest.mark.parametrize("at", (3, 4))
def test_a_collapse_a_few_batches_in_is_told_within_a_few_logs_of_its_floor(
    seed: int, n: int, groups: tuple[int, int], graded: bool, at: int
) -> None:
    # The policy falls to its floor within three batches of ``at``; the level held three or four
    # points. Told within 20 logs of its floor (most within 5-10: the noise of a few points is wide).
    got = _told(_grpo(n, seed, groups, graded, trouble="collapse", at=at))
    assert len(got) == 1, [(s, a.start_step) for s, a in got]
    told_at, collapse = got[0]
    assert at + 1 <= collapse.start_step <= at + 3
    assert told_at <= at + 3 + 20, told_at  # the floor stands from at + 3 on


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("size", (16, 64, 256))
@pytest.mark.parametrize("p0", (0.5, 0.8))
@pytest.mark.parametrize("span", (4, 6))
def test_a_reward_that_slides_from_its_first_batch_is_told_in_a_short_run(
    seed: int, size: int, p0: float, span: int
) -> None:
    n = 30
    got = _told(_sliding(n, seed, size, p0, span))
    assert len(got) == 1, [(s, a.start_step) for s, a in got]
    told_at, collapse = got[0]
    assert collapse.start_step <= span + 1 and told_at <= span + 1 + 20, (collapse.start_step, told_at)
    assert collapse.evidence["best_level"] > collapse.evidence["mean_since"]


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("size", (64, 256))
@pytest.mark.parametrize("p0", (0.5, 0.8))
def test_a_reward_held_three_batches_then_sliding_to_its_floor_is_told_within_twenty(
    seed: int, size: int, p0: float
) -> None:
    """Three batches at its level, a slide to 0 over five, then the floor: judged from where it lies most
    significantly below (the slide is no noise of the floor), it is told by the 20th batch (before, the
    slide's spread kept it from being told at all). Three rewards known before the fall leave a floor
    the run may sit at a third of the time: about ten low points are needed (reward.py, chance)."""
    got = _told(_sliding(20, seed, size, p0, span=5, hold=3))
    assert len(got) == 1, [(s, a.start_step) for s, a in got]
    told_at, collapse = got[0]
    assert 4 <= collapse.start_step <= 9 and told_at <= 20, (collapse.start_step, told_at)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n", SHORT)
@pytest.mark.parametrize("groups", SMALL + LARGE)
@pytest.mark.parametrize("graded", (False, True))
def test_healthy_short_runs_raise_no_collapse(
    seed: int, n: int, groups: tuple[int, int], graded: bool
) -> None:
    for recs in (
        _grpo(n, seed, groups, graded),  # rising, then noisy about its plateau
        _grpo(n, seed, groups, graded, rare=True),  # a reward that fires rarely and rises slowly
        _flat(n, seed, groups[0] * groups[1], graded),  # flat and noisy from the first batch
    ):
        assert _told(recs) == []
