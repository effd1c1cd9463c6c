"""RL / preference runs are judged on their own signals (detect/objective.py)."""

from __future__ import annotations

import math

import pytest

from steadytune.detect.objective import is_preference_or_rl
from tests.unit.detect import shapes
from tests.unit.detect.helpers import feed, raised, records, severe


@pytest.mark.parametrize(
    "keys, expected",
    [
        ({"rewards/chosen": 0.1, "rewards/margins": 0.3}, True),  # TRL DPO
        ({"reward": 0.5, "reward_std": 0.1, "kl": 0.01}, True),  # TRL GRPO
        ({"objective/kl": 2.0, "objective/scores": 1.0}, True),  # TRL PPO
        ({"logps/rejected": -120.0}, True),
        ({"train/acc_0": 0.5, "num-zeros": 0.0}, False),
        ({"grad_norm_clip": 1.0, "tokens_per_s": 1e4}, False),
    ],
)
def test_rl_and_preference_runs_are_known_by_their_fields(keys: dict, expected: bool) -> None:
    assert is_preference_or_rl(keys) is expected


def _grpo(n: int, seed: int, collapse_at: int | None = None, kl_jump_at: int | None = None):
    """A GRPO-like log: loss near zero (either sign), reward rising from 0.2 to 0.8, KL slowly growing."""
    rng = shapes.rng_for(seed, "grpo")
    losses, extra = [], []
    for i in range(n):
        reward = 0.2 + 0.6 * (1 - math.exp(-5 * i / n)) + rng.gauss(0, 0.03)
        if collapse_at is not None and i >= collapse_at:
            reward = 0.1 + rng.gauss(0, 0.03)
        kl = 0.001 + 0.02 * i / n
        kl *= math.exp(rng.gauss(0, 0.1))
        if kl_jump_at is not None and i >= kl_jump_at:
            kl *= 40.0
        losses.append(rng.gauss(0.0, 0.02) * (1 + i / n))
        extra.append({"reward": reward, "reward_std": 0.2, "kl": kl, "completion_length": 200.0})
    return losses, extra


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("n", (60, 600))
def test_a_healthy_grpo_run_raises_nothing(n: int, seed: int) -> None:
    losses, extra = _grpo(n, seed)
    # The loss sits near zero and changes sign: read with the SFT rules it would be all spikes.
    assert severe(feed(records([abs(x) for x in losses], extra=extra))) == []
    assert severe(feed(records(losses, extra=extra))) == []


@pytest.mark.parametrize("seed", shapes.SEEDS)
def test_a_reward_that_gives_back_all_it_gained_collapsed(seed: int) -> None:
    losses, extra = _grpo(400, seed, collapse_at=300)
    got = raised(feed(records([abs(x) for x in losses], extra=extra)))
    assert [a.kind for a in got] == ["reward_collapse"]
    assert 300 <= got[0].start_step <= 300 + 12


@pytest.mark.parametrize("seed", shapes.SEEDS)
def test_a_kl_that_jumps_blew_up(seed: int) -> None:
    losses, extra = _grpo(400, seed, kl_jump_at=250)
    got = raised(feed(records([abs(x) for x in losses], extra=extra)))
    assert [a.kind for a in got] == ["kl_blowup"]
    assert got[0].start_step == 251


def test_a_nan_loss_is_still_caught_in_an_rl_run() -> None:
    losses, extra = _grpo(100, 0)
    losses[70] = float("nan")
    got = raised(feed(records([abs(x) for x in losses], extra=extra)))
    assert [(a.kind, a.start_step) for a in got] == [("nan_loss", 71)]
