"""Gradient-norm detectors."""

from __future__ import annotations

import math

import pytest

from steadytune.config.detect import DetectConfig
from tests.unit.detect import shapes
from tests.unit.detect.helpers import feed, final, grad_noise, kinds, noisy, raised, records


# The grad norm's level is the grid's scale; its log noise is 0.05 + 2x the loss noise (0.06, 0.11,
# 0.25): gradient norms are noisier than the loss they come from.
@pytest.mark.parametrize("where", ["start", "middle"])
@pytest.mark.parametrize(shapes.GRID, shapes.grid())
def test_fp16_overflow_skip_is_a_warning_not_a_rollback(
    scale: float, noise: float, length: int, seed: int, where: str
) -> None:
    # A burst of 2-4 NaN/Inf norms with a finite loss: steps the fp16 loss scaler skipped.
    skips = shapes.fp16_skips(length, seed, where)
    grads = shapes.grad_norms(length, scale, 0.05 + 2 * noise, seed)
    rng = shapes.rng_for(seed, "nonfinite")
    for i in skips:
        grads[i] = rng.choice((math.nan, math.inf))
    got = final(records(shapes.learning(length, scale, noise, seed), grads))
    first, last = skips[0] + 1, skips[-1] + 1
    assert [(a.kind, a.severity, a.start_step, a.end_step) for a in got] == [
        ("nonfinite_grad", "warning", first, last)
    ]
    assert got[0].evidence["loss_finite"] is True


# Where the loss is NaN too, the NaN norm is part of the nan_loss episode (test_episodes.py, parts);
# the norm's own rule is seen alone with nan_loss turned off.
NO_NAN_LOSS = DetectConfig(disabled_kinds=("nan_loss",))


def test_nonfinite_grad_with_nonfinite_loss_is_critical() -> None:
    grads, losses = grad_noise(50), noisy(50, decay=0.05)
    grads[30], losses[30] = math.inf, math.nan
    got = {a.kind: a for a in raised(feed(records(losses, grads), NO_NAN_LOSS))}
    assert got["nonfinite_grad"].severity == "critical" and got["nonfinite_grad"].start_step == 31
    assert [(a.kind, a.start_step) for a in raised(feed(records(losses, grads)))] == [("nan_loss", 31)]


def test_a_nonfinite_episode_that_began_with_a_nan_loss_says_so_at_its_end() -> None:
    # HF: loss and grad norm NaN at one step, the norm NaN for three more with the loss finite again.
    grads, losses = grad_noise(50), noisy(50, decay=0.05)
    losses[30] = math.nan
    for i in range(30, 34):
        grads[i] = math.nan
    (episode,) = [a for a in final(records(losses, grads), NO_NAN_LOSS) if a.kind == "nonfinite_grad"]
    assert episode.severity == "critical" and episode.evidence["loss_finite"] is False
    assert [a.kind for a in final(records(losses, grads))] == ["nan_loss"]


def test_burst_of_skips_is_one_episode_raised_and_resolved_once() -> None:
    grads = grad_noise(60)
    for i in (20, 21, 23, 24):
        grads[i] = math.inf
    ts = feed(records(noisy(60, decay=0.05), grads))
    assert [(t.state, t.anomaly.kind) for t in ts] == [
        ("raised", "nonfinite_grad"),
        ("cleared", "nonfinite_grad"),
        ("resolved", "nonfinite_grad"),
    ]
    assert ts[-1].anomaly.evidence["nonfinite_points"] == 4 and ts[-1].anomaly.count == 1


def test_lone_grad_jump_without_the_loss_is_a_grad_spike() -> None:
    grads = grad_noise(80)
    grads[60] *= 30
    got = raised(feed(records(noisy(80, decay=0.05), grads)))
    assert [(a.kind, a.start_step, a.severity) for a in got] == [("grad_spike", 61, "warning")]


def test_grad_jump_with_the_loss_is_an_explosion() -> None:
    grads, losses = grad_noise(80), noisy(80, sigma=0.02, decay=0.05)
    for i in range(60, 80):
        grads[i] *= 50 * 1.3 ** (i - 60)
        losses[i] *= 3.0
    got = {a.kind: a for a in raised(feed(records(losses, grads)))}
    assert got["grad_explosion"].start_step == 61 and got["grad_explosion"].severity == "critical"
    assert "clip" in got["grad_explosion"].suggestion


def test_heavy_tailed_healthy_grad_norms_are_silent() -> None:
    grads = grad_noise(3000, sigma=0.35, seed=7)
    for i in range(0, 3000, 97):
        grads[i] *= 3.0  # the occasional 3x batch
    assert kinds(feed(records(noisy(3000, decay=0.002), grads))) == []


def test_warmup_grad_norms_falling_fast_are_silent() -> None:
    grads = [g * (1 + 20 * math.exp(-i / 10)) for i, g in enumerate(grad_noise(200))]
    assert kinds(feed(records(noisy(200, decay=0.02), grads))) == []


def test_vanishing_gradients_are_flagged_and_name_the_cause() -> None:
    grads = grad_noise(120)
    for i in range(60, 120):
        grads[i] *= 1e-4
    got = raised(feed(records(noisy(120, decay=0.05), grads)))
    vanish = next(a for a in got if a.kind == "grad_vanishing")
    assert 60 < vanish.start_step <= 75
    assert "vanishing" in vanish.cause


def test_zero_grad_norm_from_the_start_is_no_vanishing() -> None:
    # Pipeline engines log 0.0 when they do not compute the norm: no established level to vanish from.
    assert "grad_vanishing" not in kinds(feed(records(noisy(60, decay=0.05), [0.0] * 60)))


@pytest.mark.parametrize(
    ("jump", "stays", "expected"),
    [
        (300.0, True, ["grad_explosion"]),
        (30.0, True, ["grad_explosion"]),
        (30.0, False, ["grad_spike"]),
        (300.0, False, ["grad_explosion"]),
    ],
)
def test_one_point_is_baseline_enough_for_an_explosion_and_two_neighbours_for_a_spike(
    jump: float, stays: bool, expected: list
) -> None:
    # A first update that wrecked the model: the second norm is `jump` times the first. Past
    # explosion_ratio (100x) that one point is an explosion. 30x is a spike by ratio: one point says
    # nothing of the noise, but the point after it does, with the prior: back down 30x, the jump stood
    # above both its neighbours, a spike (raised one point late); still up `explosion_points` (3) points
    # in a row, it is an explosion from where it began (held out of the level, so the storm cannot
    # become the baseline). The spike rules fire on an explosion too: one trouble, told as the explosion.
    after = grad_noise(30, level=jump * 1.8) if stays else grad_noise(30, level=1.8)
    grads = [1.8, jump * 1.8, *after]
    got = raised(feed(records(noisy(32, decay=0.05), grads)))
    assert [(a.kind, a.start_step) for a in got] == [(k, 2) for k in expected]
    if "grad_explosion" in expected:
        assert got[0].severity == "critical" and got[0].evidence["baseline"] == pytest.approx(1.8)
    elif expected:
        assert got[0].severity == "warning" and got[0].evidence["before"] == pytest.approx(1.8)


@pytest.mark.parametrize("seed", range(4))
def test_a_storm_from_the_second_step_is_an_explosion_from_there(seed: int) -> None:
    # Real TRL DPO at LR 3.0 (transformers 5.24): 1.5 -> 122 -> 144 -> 82 -> 488. Each jump after the
    # first is small against the one before, and the first is under 100x the first norm: judged against
    # a level the storm had dragged up, nothing was raised before the fifth step.
    rng = shapes.rng_for(seed, "storm2")
    first = 1.5
    storm = [first * r * math.exp(rng.gauss(0.0, 0.2)) for r in (60.0, 75.0, 40.0, 300.0, 150.0)]
    grads = [first, *storm, *shapes.grad_norms(26, first * 50.0, 0.5, seed)]
    got = raised(feed(records(noisy(len(grads), decay=0.05), grads)))
    explosion = next(a for a in got if a.kind == "grad_explosion")
    assert explosion.start_step == 2 and explosion.severity == "critical"


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("level", [0.05, 1.5, 40.0])
def test_a_storm_that_climbs_in_steps_under_the_spike_ratio_is_an_explosion_against_the_first_norm(
    level: float, seed: int
) -> None:
    # An LR far too high: each jump stays under spike_min_ratio (8x) or inside the noise the earlier
    # jumps have taught the level, so no jump over the recent level is judged; the norm still ends far
    # beyond where the run began, which no healthy run does.
    rng = shapes.rng_for(seed, "storm")
    storm = [level * r * math.exp(rng.gauss(0.0, 0.2)) for r in (5.0, 25.0, 18.0, 60.0, 240.0, 30.0)]
    grads = [level, level * 0.97, *storm, *shapes.grad_norms(30, level * 8.0, 0.5, seed)]
    got = raised(feed(records(noisy(len(grads), decay=0.05), grads)))
    explosions = [a for a in got if a.kind == "grad_explosion"]
    assert explosions and explosions[0].severity == "critical", [(a.kind, a.start_step) for a in got]
    first = explosions[0]
    assert first.evidence["ratio_to_first"] > 100 and first.evidence["first_norm"] == pytest.approx(level)


@pytest.mark.parametrize(shapes.GRID, shapes.grid())
def test_a_norm_that_grows_a_few_times_over_its_first_is_silent(
    scale: float, noise: float, length: int, seed: int
) -> None:
    # LoRA's norm often grows from its first step as the adapters leave zero: a slow rise of up to 20x
    # (more than any healthy real run shows) is no explosion.
    base = shapes.grad_norms(length, scale, 0.05 + 2 * noise, seed)
    grads = [g * 20.0 ** (i / max(1, length - 1)) for i, g in enumerate(base)]
    got = raised(feed(records(shapes.learning(length, scale, noise, seed), grads)))
    assert not [a for a in got if a.kind.startswith("grad_")], [(a.kind, a.start_step) for a in got]


# Short runs and warm-ups: a jump judged against its two neighbours with the prior. Lengths of 15-99
# logged points (the noise window is never full), log noise 0.1-0.35, warm-ups of 0, 10 and 25% of the
# run, norms from 0.01 to 100; the jump is 9-120x the larger of its two neighbours, anywhere from the
# third point on, inside the warm-up or after it.
SHORT = [
    pytest.param(n, sigma, warm, level, seed, id=f"n{n}-s{sigma}-w{warm}-g{level}-r{seed}")
    for n in (15, 40, 99)
    for sigma in (0.1, 0.2, 0.35)
    for warm in (0.0, 0.1, 0.25)
    for level in (0.01, 1.0, 100.0)
    for seed in (0, 1)
]


@pytest.mark.parametrize(("n", "sigma", "warm", "level", "seed"), SHORT)
def test_a_jump_above_both_neighbours_in_a_short_run_is_a_grad_spike(
    n: int, sigma: float, warm: float, level: float, seed: int
) -> None:
    losses, grads, lr = shapes.short_warm_run(n, sigma, warm, level, seed)
    rng = shapes.rng_for(seed, "jump")
    at = rng.randint(2, n - 2)
    ratio = math.exp(rng.uniform(math.log(9.0), math.log(120.0)))
    grads[at] = ratio * max(grads[at - 1], grads[at + 1])
    got = raised(feed(records(losses, grads, lr=lr)))
    spikes = [a for a in got if a.kind in ("grad_spike", "grad_explosion")]
    assert spikes and spikes[0].start_step == at + 1, [(a.kind, a.start_step) for a in got]
    assert spikes[0].severity in ("warning", "critical")


@pytest.mark.parametrize(("n", "sigma", "warm", "level", "seed"), SHORT)
def test_a_short_healthy_run_with_a_warmup_raises_no_grad_alarm(
    n: int, sigma: float, warm: float, level: float, seed: int
) -> None:
    losses, grads, lr = shapes.short_warm_run(n, sigma, warm, level, seed)
    got = raised(feed(records(losses, grads, lr=lr)))
    assert not [a for a in got if a.kind.startswith("grad_")], [(a.kind, a.start_step) for a in got]


def test_a_jump_that_stays_up_in_a_short_run_is_judged_as_a_rise_not_by_its_neighbours() -> None:
    # The norm steps up 10x at point 21 and stays there: no neighbour after it came back, so the
    # neighbour rule says nothing; the rules for a rise that lasts call it an explosion from its start.
    grads = grad_noise(40, sigma=0.2)[:20] + grad_noise(20, level=10.0, sigma=0.2, seed=3)
    ts = feed(records(noisy(40, decay=0.05), grads))
    got = raised(ts)
    assert [(a.kind, a.start_step) for a in got] == [("grad_spike", 21)]
    assert "judged_by" not in got[0].evidence
    # The explosion at 23 is the spike's episode grown graver: one trouble, from its start.
    (grew,) = [t for t in ts if t.took]
    assert (grew.state, grew.anomaly.kind, grew.anomaly.start_step, grew.fired.start_step) == (
        "escalated",
        "grad_explosion",
        21,
        23,
    )


# A memorizing multi-epoch run: the loss falls twentyfold, the norm wanders 35-50% (log) from batch to
# batch, so a single 8x norm is within its 5 sigmas. Two or three norms in a row 10-20x the median of the
# eight before them are a burst, not the noise's tail.
MEMORIZING = [
    pytest.param(n, sigma, level, seed, id=f"n{n}-s{sigma}-g{level}-r{seed}")
    for n in (150, 300, 600)
    for sigma in (0.35, 0.5)
    for level in (0.05, 1.0, 20.0)
    for seed in shapes.SEEDS
]


def _memorizing(n: int, sigma: float, level: float, seed: int) -> tuple[list[float], list[float]]:
    return shapes.learning(n, 1.0, 0.05, seed, fall=3.0), shapes.grad_norms(n, level, sigma, seed)


@pytest.mark.parametrize(("n", "sigma", "level", "seed"), MEMORIZING)
def test_a_burst_of_norms_in_a_noisy_memorizing_run_is_a_grad_spike(
    n: int, sigma: float, level: float, seed: int
) -> None:
    losses, grads = _memorizing(n, sigma, level, seed)
    rng = shapes.rng_for(seed, "burst")
    at, k, ratio = int(0.7 * n), rng.randint(2, 3), rng.uniform(10.0, 20.0)
    before = sorted(grads[at - 8 : at])
    typical = 0.5 * (before[3] + before[4])
    for i in range(at, at + k):
        grads[i] = typical * ratio * math.exp(rng.gauss(0.0, 0.1))
    got = [a for a in raised(feed(records(losses, grads))) if a.kind.startswith("grad_")]
    assert [(a.kind, a.start_step) for a in got][:1] == [("grad_spike", at + 1)], [
        (a.kind, a.start_step) for a in got
    ]
    # Where 10x is past 5 sigmas (norm noise 0.35) the z-score sees the first norm alone; else the burst.
    assert got[0].evidence.get("judged_by", "burst") == "burst"


@pytest.mark.parametrize(("n", "sigma", "level", "seed"), MEMORIZING)
def test_a_noisy_memorizing_run_without_a_burst_raises_no_grad_alarm(
    n: int, sigma: float, level: float, seed: int
) -> None:
    losses, grads = _memorizing(n, sigma, level, seed)
    got = raised(feed(records(losses, grads)))
    assert not [a for a in got if a.kind.startswith("grad_")], [(a.kind, a.start_step) for a in got]
