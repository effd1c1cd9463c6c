"""The learning signal of GENERATED RL runs (detect/synthetic_rl.py) where it is thin: a reward pinned
at one value, a reward that fires rarely and rises slowly, and a rollout batch reused for several
optimizer steps (num_iterations > 1), its reward fields missing or repeated at the steps after the first.

The rules: no_learning_signal (detect/learning.py), reward_collapse (detect/reward.py), the batch of
each step (detect/rollouts.py).
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import pytest

from steadytune.detect import DetectConfig
from steadytune.detect.rollouts import RolloutBatches
from steadytune.detect.synthetic_rl import rl_run
from steadytune.records import Anomaly, StepRecord
from tests.unit.detect import shapes
from tests.unit.detect.helpers import feed, records

WINDOW = DetectConfig().rl.signal_window


def _run(n: int, seed: int, groups: tuple[int, int], beta: float, **kw: Any) -> tuple[Any, ...]:
    rng = shapes.rng_for(seed, f"rl-signal-{n}-{groups}-{beta}-{sorted(kw.items())}")
    return rl_run(rng, n, groups=groups[0], group_size=groups[1], beta=beta, **kw)


def _raised(recs: list[StepRecord]) -> list[Anomaly]:
    return [t.anomaly for t in feed(recs) if t.state == "raised" and t.anomaly.severity != "info"]


# Enough completions a batch (eight and more, in groups of four and more) that a reward firing on two
# in a hundred fires within a window of 16 batches, at the start too. At fewer, the first window
# of such a run cannot be told from one whose reward never fires: no rate is known yet (learning.py).
RARE_GROUPS = ((2, 4), (1, 16), (4, 8), (8, 8), (16, 16))


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("n", (10, 100, 2000))
@pytest.mark.parametrize("groups", RARE_GROUPS)
@pytest.mark.parametrize(
    "beta, graded, share_field", list(itertools.product((0.0, 0.04), (False, True), (True, False)))
)
def test_a_healthy_run_whose_reward_fires_rarely_and_rises_slowly_raises_nothing(
    n: int, seed: int, groups: tuple[int, int], beta: float, graded: bool, share_field: bool
) -> None:
    """Most groups tie at the floor for a long while; some learn, and the reward creeps up."""
    losses, grads, extra = _run(n, seed, groups, beta, graded=graded, share_field=share_field, rare=True)
    assert [(a.kind, a.start_step) for a in _raised(records(losses, grads, extra=extra))] == []


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("groups", ((1, 2), (1, 4)))
def test_a_rare_reward_at_one_small_group_a_step_is_told_only_before_its_rate_is_known(
    seed: int, groups: tuple[int, int]
) -> None:
    """At one group of two or four, 16 batches without a learning group come by chance, every few
    windows: once the run's own rate of them is known, such a stretch is not trouble."""
    losses, grads, extra = _run(2000, seed, groups, 0.0, rare=True)
    got = _raised(records(losses, grads, extra=extra))
    assert all(a.kind == "no_learning_signal" and a.start_step <= 3 * WINDOW for a in got), [
        (a.kind, a.start_step) for a in got
    ]


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("n", (40, 300))
@pytest.mark.parametrize("groups", ((1, 2), (1, 4), (4, 2), (2, 8), (8, 8), (16, 16)))
@pytest.mark.parametrize("beta, share_field", list(itertools.product((0.0, 0.04), (True, False))))
def test_a_reward_pinned_at_one_value_is_no_learning_signal_from_the_start(
    n: int, seed: int, groups: tuple[int, int], beta: float, share_field: bool
) -> None:
    """The policy emits one answer: most batches tie at its score, the strays score lower."""
    losses, grads, extra = _run(n, seed, groups, beta, share_field=share_field, trouble="pinned")
    got = _raised(records(losses, grads, extra=extra))
    assert [a.kind for a in got] == ["no_learning_signal"] and got[0].start_step <= WINDOW
    ev = got[0].evidence
    assert ev["to_step"] <= 2 * WINDOW  # within two windows: a third of the batches may stray
    pinned = [e["reward"] for e in extra[ev["to_step"] - WINDOW : ev["to_step"]]]
    if "pinned_reward" in ev:  # else every batch of the first window tied: a reward that never varies
        assert ev["pinned_reward"] == pytest.approx(max(pinned), rel=1e-5)
        assert WINDOW // 2 < ev["pinned_points"] < WINDOW
        assert "repeats one answer" in got[0].cause
    else:
        assert len(set(pinned)) == 1


@pytest.mark.parametrize("key", ("completions/clipped_ratio", "response_length/clip_ratio"))
@pytest.mark.parametrize("clipped, named", ((1.0, True), (0.95, True), (0.6, False)))
def test_completions_cut_at_the_length_limit_are_named_first_among_the_causes(
    key: str, clipped: float, named: bool
) -> None:
    """Every completion cut before its answer earns the same floor: the length limit, not the reward
    function, is what to change first."""
    losses, grads, extra = _run(300, 0, (2, 8), 0.0, trouble="pinned")
    extra = [{**e, key: clipped} for e in extra]
    (got,) = _raised(records(losses, grads, extra=extra))
    assert got.kind == "no_learning_signal" and got.evidence["clipped_ratio"] == clipped
    said = f"{clipped:.0%} of the last batch's completions were cut at the length limit (`{key}`)"
    assert got.cause.startswith(said) == named and (said in got.cause) == named
    assert "repeats one answer" in got.cause or "scored alike" in got.cause  # the ties, said as before


def test_a_reward_that_rises_to_a_value_it_then_repeats_is_a_solved_task_not_a_pinned_one() -> None:
    """Ties at the top the run rose to: the pinned rule leaves them to the saturation it is."""
    rng = random.Random(5)
    rewards = [min(0.7, 0.1 + 0.02 * i) if rng.random() > 0.2 else 0.3 for i in range(80)]
    extra = [{"reward": r, "reward_std": 0.0 if r == 0.7 else 0.2} for r in rewards]
    out = feed(records([0.0] * 80, [0.0 if r == 0.7 else 0.4 for r in rewards], extra=extra))
    got = [t.anomaly for t in out if t.state == "raised"]
    assert [(a.kind, a.severity) for a in got] == [("no_learning_signal", "info")]


def test_a_batch_mean_that_repeats_without_a_tied_field_is_pinned_only_below_a_peak_it_never_passed() -> None:
    """No field says the batches tied: a reward of one completion a step (0 or 1) repeats by chance."""
    rng = random.Random(2)
    coin = [float(rng.random() < 0.7) for _ in range(60)]  # one completion a step, right 70 % of the time
    det_extra = [{"reward": r, "objective/kl": 0.01} for r in coin]
    assert _raised(records([0.1] * 60, [0.5] * 60, extra=det_extra)) == []
    # A batch mean pinned at -0.1, a few batches a little below, never above: the policy's one answer.
    scores = [-0.1 if rng.random() < 0.7 else -0.1 - rng.choice((0.0025, 0.0015, 0.004)) for _ in range(60)]
    got = _raised(records([None] * 60, extra=[{"objective/scores": s, "objective/kl": 5.0} for s in scores]))
    assert [a.kind for a in got] == ["no_learning_signal"] and got[0].start_step <= WINDOW
    assert got[0].evidence["pinned_reward"] == -0.1


def _iterations(n: int, seed: int, groups: tuple[int, int], k: int, how: str, **kw: Any) -> list[StepRecord]:
    """The run of ``rl_run``, each rollout batch learned from over ``k`` optimizer steps; the steps after
    the first log the loss, the norm and the KL, and the batch's reward fields ``how``: "missing" or
    "repeated"."""
    losses, grads, extra = _run(n, seed, groups, 0.04, **kw)
    rng = shapes.rng_for(seed, "iterations")
    out_l: list[float | None] = []
    out_g: list[float | None] = []
    out_e: list[dict[str, Any]] = []
    for loss, g, e in zip(losses, grads, extra, strict=True):
        for j in range(k):
            out_l.append(loss)
            out_g.append(None if g is None else g * math.exp(rng.gauss(0, 0.1)))
            out_e.append(e if j == 0 or how == "repeated" else {"kl": e.get("kl", 0.0)})
    return records(out_l, out_g, extra=out_e)


# One group of four ties most batches early, so a repeating log shows its repeat count (on batches
# with spread) only after a few dozen steps; until then each repeat counts (rollouts.py).
@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize(
    "groups, how",
    [
        ((1, 4), "missing"),
        ((2, 8), "missing"),
        ((16, 16), "missing"),
        ((2, 8), "repeated"),
        ((16, 16), "repeated"),
    ],
)
@pytest.mark.parametrize("k", (2, 4))
def test_a_batch_learned_from_over_several_steps_is_counted_once(
    seed: int, groups: tuple[int, int], how: str, k: int
) -> None:
    """A healthy run stays quiet (its tied batches' further steps are holes in the norm too); a dead
    one is told once, at its first step, after a window of batches, not of steps."""
    assert _raised(_iterations(200, seed, groups, k, how)) == []
    got = _raised(_iterations(60, seed, groups, k, how, trouble="dead"))
    assert [(a.kind, a.start_step) for a in got] == [("no_learning_signal", 1)]
    if how == "missing":  # a dead batch repeated has no spread to tell its repeats by: each counts
        assert got[0].evidence["to_step"] == (WINDOW - 1) * k + 1


def test_which_steps_bring_a_new_batch() -> None:
    b = RolloutBatches()
    spread = [{"reward": 0.1 * i, "reward_std": 0.3, "frac_reward_zero_std": 0.5} for i in range(5)]
    # Missing: the further steps carry the batch's tied share, and bring no new batch.
    assert [(x.tied, x.again) for x in map(b.see, [spread[0], {"kl": 0.1}, None])] == [
        (0.5, False),
        (0.5, True),
        (0.5, True),
    ]
    # Repeated: believed once three batches with spread came exactly twice each.
    b = RolloutBatches()
    seen = [b.see(e).again for e in (spread[0], spread[0], spread[1], spread[1], spread[2], spread[2])]
    assert seen == [False] * 6  # until then, a repeat counts as a batch
    dead = {"reward": 0.0, "reward_std": 0.0, "frac_reward_zero_std": 1.0}
    assert [b.see(e).again for e in (spread[3], dead, dead, dead, dead)] == [False, False, True, False, True]
    # verl's names: the task's score is the reward, an advantage range of 0 a batch whose groups all tied.
    b = RolloutBatches()
    verl = [{"critic/score/mean": 0.0, "critic/advantages/max": 0.0, "critic/advantages/min": 0.0},
            {"actor/kl_loss": 0.1}, {"critic/score/mean": 0.25, "critic/advantages/max": 1.2,
            "critic/advantages/min": -0.8}]  # fmt: skip
    assert [(x.tied, x.again) for x in map(b.see, verl)] == [(1.0, False), (1.0, True), (None, False)]
    # A chance repeat (twice, once) is no pattern: every point counts.
    b = RolloutBatches()
    assert not any(b.see(e).again for e in (spread[0], spread[0], spread[1], spread[2], dead, dead))
