"""kl_blowup in a run's FIRST points (detect/kl.py): a fresh policy's KL climbs from 0 by orders of
magnitude in its first points, healthy, so a young level under ``rl.kl_runaway_min`` is judged by the
prior instead; a burst orders of magnitude above what a fresh policy shows is told at its point.

All KL series are generated (tests/unit/detect/shapes.py: ``fresh_kl``) over length, end level, noise,
the shape of the climb and how loggers show the first point.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest

from steadytune.detect import DetectConfig, LiveDetector
from steadytune.detect.kl import per_token
from steadytune.records import Anomaly, StepRecord
from tests.unit.detect import shapes
from tests.unit.detect.helpers import records

FIRSTS = ("small", "zero", "tiny")
NOISES = (0.1, 0.3, 0.6)  # log-space noise of one batch's KL estimate
ENDS = (0.01, 0.03, 0.1)  # where a healthy GRPO run's per-token KL levels off
LENGTHS = (3, 5, 8, 12, 30, 200)


def _records(kls: list[float], seed: int, end: float, fields: str = "grpo") -> list[StepRecord]:
    """A run that logs ``kls`` under a trainer's names, and learns: its reward rises (noisily) as the
    policy moves off its reference towards ``end``, as a healthy run pays for its KL."""
    n = len(kls)
    rng = shapes.rng_for(seed, f"kl-early-reward-{n}")
    extra: list[dict[str, object]] = []
    moved = 0.0
    for kl in kls:
        moved = max(moved, min(1.0, kl / end))
        reward = 0.2 + 0.5 * math.sqrt(moved) + rng.gauss(0, 0.05)
        if fields == "grpo":
            extra.append({"reward": reward, "reward_std": 0.3, "frac_reward_zero_std": 0.3, "kl": kl})
        elif fields == "ppo":  # TRL's PPOTrainer: a KL summed over each completion
            extra.append({"objective/scores": reward, "objective/kl": kl})
        else:  # TRL's KTOTrainer: a KL between whole sequences
            extra.append({"kl": kl, "rewards/chosen": reward, "logps/chosen": -50.0})
    return records([0.01] * n, [0.5] * n, extra=extra)


def _kl_told(recs: list[StepRecord], config: DetectConfig | None = None) -> list[tuple[int, Anomaly]]:
    """Each kl_blowup raised, with the step it was raised at."""
    det, out = LiveDetector(config), []
    for r in recs:
        out += [(r.step, t.anomaly) for t in det.observe_step(r) if t.state == "raised"]
    return [(s, a) for s, a in out if a.kind == "kl_blowup"]


@pytest.mark.parametrize("first", FIRSTS)
@pytest.mark.parametrize("noise", NOISES)
@pytest.mark.parametrize("shape", shapes.FRESH_KL)
def test_a_fresh_policys_kl_climbing_from_zero_raises_nothing(shape: str, noise: float, first: str) -> None:
    """From ~0 (or exactly 0, or the reference's rounding) to 0.01-0.1 nats, by every curve, in runs
    of 3 to 200 points: the first points grow tenfold to a thousandfold, and that is no jump."""
    for n, end, seed in itertools.product(LENGTHS, ENDS, (0, 1)):
        kls = shapes.fresh_kl(n, end, noise, seed, shape, first)
        assert _kl_told(_records(kls, seed, end)) == [], (n, end, seed)


@pytest.mark.parametrize("fields", ["ppo", "kto"])
@pytest.mark.parametrize("shape", shapes.FRESH_KL)
def test_a_kl_summed_over_sequences_is_not_held_to_the_per_token_prior(shape: str, fields: str) -> None:
    """TRL's PPO and KTO log a KL over whole completions: 1 to 10 within a few points of a healthy
    start. Their first points are judged against their own level only."""
    for n, end, noise, seed, first in itertools.product(
        (5, 8, 12, 30), (1.0, 3.0, 10.0), NOISES, (0, 1), FIRSTS
    ):
        kls = shapes.fresh_kl(n, end, noise, seed, shape, first)
        assert _kl_told(_records(kls, seed, end, fields)) == [], (n, end, noise, seed, first)


def test_only_a_per_token_kl_of_an_rl_run_is_held_to_the_prior() -> None:
    assert per_token("RL (GRPO/RLOO)", "kl")
    assert per_token("RL or preference", "actor/kl_loss")
    assert not per_token("RL (PPO)", "objective/kl")
    assert not per_token("RL or preference", "objective/kl")
    assert not per_token("preference (KTO)", "kl")
    assert not per_token(None, "kl")


def _bursts() -> list:
    """(shape, first, noise, end). A run whose first points already stand about the prior's 0.1 (an
    end of 0.1 at 30 % noise and more) is judged by its own young level, 42-73x over it: a leap to 3
    nats from there is within that bar, and is left out."""
    out = []
    for shape, first, noise, end in itertools.product(shapes.FRESH_KL, FIRSTS, NOISES, ENDS):
        if end == 0.1 and noise >= 0.3:
            continue
        out.append(pytest.param(shape, first, noise, end, id=f"{shape}-{first}-n{noise}-e{end}"))
    return out


@pytest.mark.parametrize("shape, first, noise, end", _bursts())
def test_an_early_burst_is_told_at_its_point(shape: str, first: str, noise: float, end: float) -> None:
    """One update throws a fresh policy far off (an LR burst) at its 2nd to 8th logged point: its KL
    leaps to 3-30 nats per token, for one point, a few, or for good. Told at that point, as a jump
    judged by the fresh policy's prior (or, where its young level is already above the prior, by
    that level), and only once."""
    for n, seed, width in itertools.product((12, 30, 200), (0, 1, 2), (1, 3, n_all := 10_000)):
        rng = random.Random(f"burst-{shape}-{first}-{noise}-{end}-{n}-{seed}-{width}")
        kls = shapes.fresh_kl(n, end, noise, seed, shape, first)
        at = rng.randint(2 if first == "zero" else 1, 7)  # a first KL of exactly 0 is no point to judge
        size = 10 ** rng.uniform(0.5, 1.5)
        for i in range(at, min(n, at + width)):  # it leaps to `size`, then stays about there
            kls[i] = size * (math.exp(rng.gauss(0, noise)) if i > at else 1.0)
        told = _kl_told(_records(kls, seed, end))
        case = (n, seed, width if width < n_all else "for good", at + 1, round(size, 2))
        assert [(s, a.start_step) for s, a in told][:1] == [(at + 1, at + 1)], case
        assert told[0][1].evidence["ratio"] >= 10, case
        assert len(told) == 1, case
        if end < 0.1:  # the young level under the prior: the prior judged it
            assert told[0][1].evidence["judged_by"] == "fresh policy", case


def test_a_floor_of_zero_turns_the_prior_off() -> None:
    """``rl.kl_runaway_min`` 0 (no floor to a runaway) leaves no prior either: every young level is
    the run's own. The same early leap the prior tells at its point."""
    kls = shapes.fresh_kl(30, 0.01, 0.1, 0, "saturating")
    kls[1:4] = [5.0] * 3
    recs = _records(kls, 0, 0.01)
    assert [(s, a.evidence["judged_by"]) for s, a in _kl_told(recs)] == [(2, "fresh policy")]
    off = _kl_told(recs, DetectConfig.model_validate({"rl": {"kl_runaway_min": 0.0}}))
    assert all(a.evidence.get("judged_by") is None for _, a in off)
