"""A finished RL or preference run whose reward never rose (detect/flat.py), on GENERATED runs
(detect/synthetic_rl.py): healthy learners, slow ones included, over length and group size stay quiet;
a reward whose policy never improves is told once the run is over, as one episode over the run.
"""

from __future__ import annotations

import math
import random

import pytest

from steadytune.detect import DetectConfig, detect
from steadytune.detect.flat import FlatLimits, FlatRewardWatch, flatness
from steadytune.detect.synthetic_rl import dpo_run, rl_run
from steadytune.records import Anomaly, StepRecord
from tests.unit.detect import shapes
from tests.unit.detect.helpers import feed, records

FLAT_GAIN = DetectConfig().rl.flat_gain
# Completions a step (groups x group size) whose healthy learners gain at least one noise sigma over
# the run: the rule's guarantee. A gain below half the noise (one group of four, a rare reward) is
# indistinguishable from none at any length: said in docs/detectors.md, not tested as quiet.
GROUPS = ((2, 8), (4, 8), (16, 16))


def _grpo(n: int, seed: int, groups: tuple[int, int], **kw: object) -> list[StepRecord]:
    rng = shapes.rng_for(seed, f"rl-flat-{n}-{groups}-{sorted(kw.items())}")
    losses, grads, extra = rl_run(rng, n, groups=groups[0], group_size=groups[1], **kw)  # type: ignore[arg-type]
    return records(losses, grads, extra=extra)


def _flat_told(recs: list[StepRecord]) -> list[Anomaly]:
    return [
        t.anomaly
        for t in feed(recs)
        if t.state == "raised"
        and t.anomaly.kind == "no_learning_signal"
        and t.anomaly.evidence.get("whole_run")
    ]


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("n", (100, 600, 3000))
@pytest.mark.parametrize("groups", GROUPS)
@pytest.mark.parametrize("rare", (False, True))
def test_a_healthy_learner_slow_ones_included_is_not_flat(
    n: int, seed: int, groups: tuple[int, int], rare: bool
) -> None:
    """A reward rising over the whole run (``rare``: from a few completions in a hundred, slowly)."""
    assert _flat_told(_grpo(n, seed, groups, rare=rare)) == []


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("n", (100, 1000))
def test_a_healthy_dpo_run_is_not_flat(n: int, seed: int) -> None:
    rng = shapes.rng_for(seed, f"dpo-flat-{n}")
    losses, grads, lrs, extra = dpo_run(rng, n)
    assert _flat_told(records(losses, grads, lr=lrs, extra=extra)) == []


@pytest.mark.parametrize("n", (1000, 3000))
@pytest.mark.parametrize("groups", ((1, 8), *GROUPS))
def test_a_reward_that_never_rises_is_told_once_the_run_is_over(n: int, groups: tuple[int, int]) -> None:
    """Its groups tie and differ as a learner's do, so no window is exact; over the run nothing rose.
    Told at 80 % power, less a start that rose by chance: most runs, not all, each as one episode over
    the run."""
    told = 0
    for seed in range(6):
        recs = _grpo(n, seed, groups, trouble="flat")
        got = [a for a in detect(recs) if a.kind == "no_learning_signal"]
        assert len(_flat_told(recs)) == len(got) <= 1
        if got:
            assert (got[0].start_step, got[0].end_step, got[0].metric) == (
                recs[0].step,
                recs[-1].step,
                "reward",
            )
            assert got[0].severity == "warning" and "would have shown" in (got[0].cause or "")
            told += 1
    assert told >= 4


@pytest.mark.parametrize("groups", ((1, 4), (1, 8)))
def test_a_sparse_reward_that_never_rises_is_told_where_its_noise_allows(groups: tuple[int, int]) -> None:
    """A reward at its floor on most batches (one group of four or eight, a right answer a few times in
    a hundred) that never rises, over 400 points. Its noise is the root mean square of its successive
    differences: the mean absolute difference is the noise only for a bell-shaped one, and a series of
    zeros with a rare hit has a mean absolute difference far under its spread, which asked for more
    points than the run had to show a gain of half of it (told in 0 of these 10 runs)."""
    told = sum(bool(_flat_told(_grpo(400, seed, groups, rare=True, trouble="flat"))) for seed in range(10))
    assert told >= 6


@pytest.mark.parametrize("seed", shapes.SEEDS)
def test_a_short_flat_run_is_not_told_it_cannot_show_a_small_gain(seed: int) -> None:
    """Fifty points of a noisy reward: a gain of half its noise would not show; none showing says nothing."""
    assert _flat_told(_grpo(50, seed, (4, 8), trouble="flat")) == []


@pytest.mark.parametrize("seed", shapes.SEEDS)
def test_a_log_that_begins_mid_run_is_not_told(seed: int) -> None:
    """A resumed run's log does not show the gain made before it: a reward held there is no stuck one."""
    recs = _grpo(1000, seed, (4, 8), trouble="flat")
    later = [
        StepRecord(step=r.step + 5000, ts=r.ts, loss=r.loss, grad_norm=r.grad_norm, extra=r.extra)
        for r in recs
    ]
    assert _flat_told(later) == []


@pytest.mark.parametrize("seed", shapes.SEEDS)
def test_a_run_the_windowed_rule_told_is_one_episode(seed: int) -> None:
    """A pinned reward is told by the windowed rule from its start; the run's end adds nothing."""
    recs = _grpo(1000, seed, (4, 8), trouble="pinned")
    got = [t.anomaly for t in feed(recs) if t.state == "raised" and t.anomaly.kind == "no_learning_signal"]
    assert len(got) == 1 and not got[0].evidence.get("whole_run")


def test_analyze_tells_it_and_a_second_finish_adds_nothing() -> None:
    """Offline replay ends the run itself: the finding is in detect()'s episodes, told once."""
    recs = _grpo(2000, 0, (4, 8), trouble="flat")
    flat = [a for a in detect(recs) if a.evidence.get("whole_run")]
    assert [(a.kind, a.start_step, a.end_step) for a in flat] == [("no_learning_signal", 1, 2000)]
    rl = DetectConfig().rl
    watch = FlatRewardWatch(FlatLimits(FLAT_GAIN, rl.signal_window, rl.run_signal_share))
    out: list = []
    watch.finish(out)
    watch.finish(out)
    assert out == []


def _ar1(rng: random.Random, n: int, r: float) -> list[float]:
    y, out = 0.0, []
    for _ in range(n):
        y = r * y + rng.gauss(0, 1) * math.sqrt(1 - r * r)
        out.append(y)
    return out


@pytest.mark.parametrize("r", (0.0, 0.5, 0.9))
def test_a_wandering_reward_holds_fewer_points_than_it_has(r: float) -> None:
    """A rise of one noise sigma over the run: seen through correlated noise as through white noise, since
    the standard error widens with the lag-one autocorrelation; at 0.9 the run holds 20x fewer points."""
    told = 0
    for seed in range(40):
        rng = random.Random(seed)
        n = 2000
        ys = [y + i / n for i, y in enumerate(_ar1(rng, n, r))]
        f = flatness(ys)
        assert f is not None
        told += f.flat(FLAT_GAIN)
    assert told <= 2  # the 80 % power's other side, for a gain of twice the smallest: rarely


def test_a_reward_that_rose_in_its_first_dozen_steps_and_held_learned() -> None:
    """A rise of two noise sigmas over the first 12 of 600 points, then flat: its line is flat (a gain
    of 0.24 sigma, not significant), but the rest lies far above its first points (a t of 4 expected
    over the first 8), so it is told flat only where the noise hides that: rarely."""
    told = 0
    for seed in range(40):
        rng = random.Random(seed)
        f = flatness([min(1.0, i / 12) * 2 + rng.gauss(0, 1) for i in range(600)])
        assert f is not None
        told += f.flat(FLAT_GAIN)
    assert told <= 4
