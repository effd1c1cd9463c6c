"""A finished RL run whose batches mostly carried no learning group, its reward never up (detect/flat.py,
``rl.run_signal_share``), on GENERATED GRPO runs: each step's groups of completions drawn one by one, a
right answer scoring 1. A reward that fires on a few completions in a hundred and never rises is told
once the run is over, as one episode over the run, whatever the run's length; a run that rises out of
its ties, a solved run tied at its top and a healthy learner stay quiet.
"""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

import pytest

from steadytune.detect import DetectConfig
from steadytune.records import Anomaly, StepRecord
from tests.unit.detect import shapes
from tests.unit.detect.helpers import feed, records


def _grpo(
    rng: random.Random, n: int, p0: float, p1: float, groups: int, size: int, names: str = "trl"
) -> list[StepRecord]:
    """``n`` GRPO steps whose chance of a right answer goes from ``p0`` to ``p1`` along the run, their
    batch's fields as TRL logs them (``trl``), without the tied share (``std``), or as verl does
    (``verl``: the task's score and the advantages' range)."""
    losses: list[float] = []
    grads: list[float] = []
    extra: list[dict[str, Any]] = []
    for i in range(n):
        p = p0 + (p1 - p0) * i / max(n - 1, 1)
        batch = [[float(rng.random() < p) for _ in range(size)] for _ in range(groups)]
        tied = sum(len(set(g)) == 1 for g in batch)
        flat = [r for g in batch for r in g]
        learning = groups - tied
        # A tied group has no advantage: its batch's gradient is the KL term's alone.
        grads.append((0.3 * math.sqrt(learning / groups) if learning else 1e-3) * math.exp(rng.gauss(0, 0.2)))
        losses.append(1e-4 * rng.gauss(0, 1) if learning else 0.0)
        kl = 1e-3 * math.exp(rng.gauss(0, 0.3))
        if names == "verl":
            edge = 0.0 if learning == 0 else 1.5  # a tied group's advantages are 0
            fields = {"critic/score/mean": statistics.fmean(flat), "actor/kl_loss": kl,
                      "critic/advantages/max": edge, "critic/advantages/min": -edge}  # fmt: skip
        else:
            fields = {"reward": statistics.fmean(flat), "reward_std": statistics.pstdev(flat), "kl": kl}
            if names == "trl":
                fields["frac_reward_zero_std"] = tied / groups
        extra.append(fields)
    return records(losses, grads, extra=extra)


def _whole_run(recs: list[StepRecord], config: DetectConfig | None = None) -> list[Anomaly]:
    return [a for a in _told(recs, config) if a.evidence.get("whole_run")]


def _told(recs: list[StepRecord], config: DetectConfig | None = None) -> list[Anomaly]:
    """The run's ``no_learning_signal`` episodes, as raised, live or offline."""
    return [
        t.anomaly
        for t in feed(recs, config)
        if t.state == "raised" and t.anomaly.kind == "no_learning_signal"
    ]


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("n", (30, 150, 600))
@pytest.mark.parametrize(("groups", "size", "p"), ((1, 8, 0.01), (2, 4, 0.01), (1, 16, 0.005)))
@pytest.mark.parametrize("names", ("trl", "std", "verl"))
def test_a_reward_that_rarely_fires_and_never_rises_is_told_once_over_the_run(
    seed: int, n: int, groups: int, size: int, p: float, names: str
) -> None:
    """Nine batches in ten or more tie at 0 (``frac_reward_zero_std`` 1, a ``reward_std`` of 0 where
    the share is not logged, verl's advantage range of 0); the rest carry one or two right answers.
    One episode: the windowed rule's where sixteen batches in a row tied by chance, else the whole
    run's, from its first step to its last. (A verl log's batches were not read as tied: each stretch
    of sixteen scores of exactly 0 was an episode of its own, several a run.)"""
    rng = shapes.rng_for(seed, f"tied-run-{n}-{groups}-{size}-{p}-{names}")
    recs = _grpo(rng, n, p, p, groups, size, names)
    trouble = [t.anomaly for t in feed(recs) if t.state == "raised" and t.anomaly.severity != "info"]
    # Where the rare hits bunch by chance (five in nine points) and then stop for sixty, the reward's
    # level rose and fell, and the run is told as a reward_collapse instead: one episode either way.
    assert len(trouble) == 1 and trouble[0].kind in ("no_learning_signal", "reward_collapse")
    got = _told(recs)
    if got and got[0].evidence.get("whole_run"):
        assert (got[0].start_step, got[0].evidence["to_step"]) == (1, n)


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize(("n", "p0", "p1"), ((600, 0.002, 0.05), (2000, 0.002, 0.04), (300, 0.01, 0.3)))
def test_a_run_that_rises_out_of_its_ties_is_not_told(seed: int, n: int, p0: float, p1: float) -> None:
    """Most batches tie at 0 at first (for the two longest, over the whole run), and the reward rises
    significantly: slow learning, not none."""
    rng = shapes.rng_for(seed, f"tied-rising-{n}-{p0}-{p1}")
    assert _whole_run(_grpo(rng, n, p0, p1, 1, 4)) == []


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("n", (30, 300))
def test_a_solved_run_tied_at_its_top_is_not_told(seed: int, n: int) -> None:
    """Nearly every group scores every completion right: ties at the top are a solved task, not this."""
    rng = shapes.rng_for(seed, f"tied-top-{n}")
    assert _whole_run(_grpo(rng, n, 0.995, 0.995, 1, 8)) == []


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("n", (30, 300))
def test_a_healthy_learner_is_not_told(seed: int, n: int) -> None:
    rng = shapes.rng_for(seed, f"tied-healthy-{n}")
    assert _whole_run(_grpo(rng, n, 0.2, 0.6, 4, 8)) == []


def test_a_share_of_zero_turns_it_off() -> None:
    """A short run (30 points: under the flat-reward path's power) whose ties no window told."""
    rng = shapes.rng_for(0, "tied-run-30-1-8-0.01-trl")
    recs = _grpo(rng, 30, 0.01, 0.01, 1, 8)
    assert len(_whole_run(recs)) == 1  # told at the default
    config = DetectConfig.model_validate({"rl": {"run_signal_share": 0}})
    assert _whole_run(recs, config) == []
