"""Loss detectors on small exact series: the right kind at the right step, silence on healthy shapes."""

from __future__ import annotations

import math

import pytest

from steadytune.detect import DetectConfig, LiveDetector
from steadytune.detect.build import fill
from steadytune.detect.stats import SeriesLimits
from tests.unit.detect import shapes
from tests.unit.detect.helpers import feed, kinds, noisy, raised, records, severe


def test_nan_loss_is_caught_on_the_same_step() -> None:
    losses = noisy(60)
    losses[40] = math.nan
    got = raised(feed(records(losses)))
    assert [(a.kind, a.start_step, a.severity) for a in got] == [("nan_loss", 41, "critical")]


def test_inf_loss_is_nan_loss_too() -> None:
    losses = noisy(30)
    losses[20] = math.inf
    assert kinds(feed(records(losses))) == ["nan_loss"]


def test_spike_fires_at_its_step_with_evidence() -> None:
    losses = noisy(80, sigma=0.02)
    losses[50] *= 3.0
    got = raised(feed(records(losses)))
    assert [(a.kind, a.start_step) for a in got] == [("loss_spike", 51)]
    ev = got[0].evidence
    assert ev["ratio"] > 2.5 and ev["threshold_ratio"] < ev["ratio"]
    assert "LR" in got[0].suggestion


def test_spike_that_recovers_is_resolved_once_and_is_no_divergence() -> None:
    losses = noisy(80, sigma=0.02)
    losses[50] *= 3.0
    ts = feed(records(losses))
    states = [(t.state, t.anomaly.kind) for t in ts]
    assert states == [("raised", "loss_spike"), ("cleared", "loss_spike"), ("resolved", "loss_spike")]
    assert ts[-1].anomaly.end_step == 51 and ts[-1].anomaly.count == 1


def test_spike_that_stays_up_becomes_divergence() -> None:
    losses = noisy(80, sigma=0.02)
    for i in range(50, 80):
        losses[i] *= 4.0
    got = raised(feed(records(losses)))
    assert [(a.kind, a.start_step) for a in got] == [("loss_spike", 51), ("divergence", 53)]
    assert got[1].severity == "critical"


# The first points of a run, before the noise window is full: a point judged by its two neighbours.
# Short smooth runs (12-60 points, log noise 0.5-3%) over the scales, a 3x point anywhere from the third
# point to the twelfth, between two ordinary ones; the young baseline alone (its floor 5.4x) let it by.
EARLY = [
    pytest.param(scale, noise, length, seed, id=f"s{scale}-n{noise}-l{length}-r{seed}")
    for scale in shapes.SCALES
    for noise in (0.005, 0.01, 0.03)
    for length in (12, 30, 60)
    for seed in shapes.SEEDS
]


@pytest.mark.parametrize(shapes.GRID, EARLY)
def test_an_early_point_3x_above_both_neighbours_in_a_smooth_run_is_a_spike(
    scale: float, noise: float, length: int, seed: int
) -> None:
    losses = shapes.learning(length, scale, noise, seed)
    at = shapes.rng_for(seed, "at").randint(2, min(12, length - 2))
    losses[at] = 3.0 * max(losses[at - 1], losses[at + 1])
    got = raised(feed(records(losses)))
    assert [(a.kind, a.start_step) for a in got] == [("loss_spike", at + 1)]
    # Past the young baseline's floor the level may see it first (no "judged_by"); either way one spike.
    ev = got[0].evidence
    assert got[0].severity == "warning" and ev["threshold_ratio"] < ev["ratio"]
    if ev.get("judged_by") == "neighbours":
        assert ev["ratio"] == pytest.approx(3.0, rel=1e-3)


def test_an_early_spike_is_raised_when_the_point_after_it_comes_back_and_resolved_there() -> None:
    losses = shapes.learning(20, 2.0, 0.01, 0)
    losses[4] = 3.0 * losses[3]
    det = LiveDetector()
    states = []
    for rec in records(losses):
        states += [(rec.step, t.state, t.anomaly.kind) for t in det.observe_step(rec)]
    assert states[:2] == [(6, "raised", "loss_spike"), (6, "cleared", "loss_spike")]


@pytest.mark.parametrize("length", (12, 30, 60, 99))
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("scale", shapes.SCALES)
def test_early_noise_of_a_batch_size_one_run_is_no_spike(scale: float, seed: int, length: int) -> None:
    # One sample's loss per point (35% log noise, fat-tailed): points 3x their neighbours are ordinary,
    # and before any difference is measured the prior must allow for them.
    assert severe(feed(records(shapes.per_sample(length, scale, seed)))) == []


# "length" here is the healthy points before the jump. One point is no baseline for a 3x jump (the
# young-baseline floor is 5.4x: which of the two points is the odd one?), so 3x starts at 10 points;
# a 7x jump is caught even after a single point.
JUMPS = [
    pytest.param(*p.values, ratio, id=f"{p.id}-x{ratio:g}")
    for ratio in (3.0, 7.0)
    for p in shapes.grid(lengths=(10, 100) if ratio < 5.4 else (1, 10, 100))
]


@pytest.mark.parametrize("frozen", [True, False])
@pytest.mark.parametrize(shapes.GRID + ", ratio", JUMPS)
def test_jump_that_stays_up_is_a_spike_then_divergence(
    scale: float, noise: float, length: int, seed: int, ratio: float, frozen: bool
) -> None:
    # The loss jumps ratio-x at one step and stays there (frozen at one value, or noisy at the new level).
    losses = shapes.jump_and_stay(length, 10, scale, noise, seed, ratio, frozen)
    got = raised(feed(records(losses)))
    jump = length + 1
    assert [a.kind for a in got] == ["loss_spike", "divergence"]
    assert got[0].start_step == jump and jump <= got[1].start_step <= jump + 2
    assert got[1].severity == "critical"


def test_slow_climb_is_divergence() -> None:
    losses = noisy(200, sigma=0.02, decay=0.03)
    for i in range(100, 200):
        losses[i] *= 2.0 ** ((i - 100) / 25)
    got = raised(feed(records(losses)))
    assert [a.kind for a in got] == ["divergence"]
    assert 100 < got[0].start_step < 140


def _raised_at(losses: list[float], kind: str) -> tuple[int, int] | None:
    """(point at which the first ``kind`` alarm was raised, its start step), live."""
    det = LiveDetector()
    for rec in records(losses):
        for t in det.observe_step(rec):
            if t.state == "raised" and t.anomaly.kind == kind:
                return rec.step, t.anomaly.start_step
    return None


# A climb whose line stands out of the noise (t >= climb_t over 16 points: noise up to ~2.2x the rise
# per point) is known within the level window and divergence_points of its start, plus K = 5, plus the
# points it takes to rise the spike_z/2 noise units the level must clear above its (luckiest) best.
CLIMBS = [
    pytest.param(scale, noise, seed, double_in, id=f"s{scale}-n{noise}-r{seed}-d{double_in}")
    for scale in shapes.SCALES
    for seed in shapes.SEEDS
    for noise, double_in in ((0.005, 60), (0.005, 30), (0.015, 40), (0.015, 20), (0.03, 20), (0.03, 12))
]


@pytest.mark.parametrize("scale, noise, seed, double_in", CLIMBS)
def test_a_steady_climb_is_a_divergence_before_it_is_142x(
    scale: float, noise: float, seed: int, double_in: int
) -> None:
    at = 120
    got = _raised_at(shapes.climb(at, 80, scale, noise, seed, double_in), "divergence")
    assert got is not None, "the climb was missed"
    c = DetectConfig()
    luck = 0.5 * c.loss.spike_z * max(noise, c.loss.noise_floor)
    bound = c.series.level_window + c.loss.divergence_points + 5 + math.ceil(luck * double_in / math.log(2.0))
    raised_at, start = got
    assert at < start and raised_at - at <= bound, f"raised {raised_at - at} points into the climb"


@pytest.mark.parametrize("rise", (0.06, 0.09))
@pytest.mark.parametrize(shapes.GRID, shapes.grid(lengths=(300,)))
def test_a_smooth_bump_under_the_climb_floor_is_no_divergence(
    scale: float, noise: float, length: int, seed: int, rise: float
) -> None:
    # Under climb_min_rise (10%) a rise is no climb however straight it is; it comes back down.
    losses = shapes.bump(length, scale, noise, seed, at=150, rise=rise, width=20)
    assert severe(feed(records(losses))) == []


def _point_noise(losses: list[float]) -> float:
    """The loss watch's noise per point (log space) after these losses."""
    tracker = fill(SeriesLimits, DetectConfig(), ("loss", "series")).tracker()
    for x in losses:
        tracker.accept(math.log(x))
    return tracker.sigma


@pytest.mark.parametrize("luck", (0.3, 0.6))
@pytest.mark.parametrize(shapes.GRID, shapes.grid(lengths=(300,), noises=(0.1, 0.2)))
def test_a_straight_bump_within_the_best_levels_luck_is_no_divergence(
    scale: float, noise: float, length: int, seed: int, luck: float
) -> None:
    # A harder stretch of data seen through a running-average loss: the level climbs along a line
    # (t far past climb_t: the averaging took the scatter out, not the wander) past climb_min_rise, and
    # comes back. Under the spike_z/2 noise units the creeping-level rule also grants the luckiest best
    # level, the line alone is no divergence.
    c = DetectConfig()
    at, width = 150, 12
    losses = shapes.smoothed(length, scale, noise, seed, beta=0.8)
    rise = c.loss.climb_min_rise + luck * 0.5 * c.loss.spike_z * _point_noise(losses[:at])
    for i in range(at, min(length, at + 2 * width)):
        losses[i] *= math.exp(rise * math.sin(math.pi * (i - at) / (2 * width)))
    assert "divergence" not in kinds(feed(records(losses)))


def test_exact_zero_is_collapse_on_the_same_step() -> None:
    losses = noisy(60)[:40] + [0.0] * 20
    got = raised(feed(records(losses)))
    assert (got[0].kind, got[0].start_step, got[0].severity) == ("loss_collapse", 41, "critical")
    assert "label" in got[0].cause


def test_sudden_drop_to_near_zero_is_collapse() -> None:
    losses = noisy(60)[:40] + [1e-5] * 20
    got = raised(feed(records(losses)))
    assert [a.kind for a in got][:1] == ["loss_collapse"]
    assert got[0].start_step in (41, 42)


@pytest.mark.parametrize(shapes.GRID, shapes.grid(noises=(0.2, 0.3, 0.4)))
def test_noisy_batch_size_one_losses_are_silent(scale: float, noise: float, length: int, seed: int) -> None:
    # Per-sample losses (batch size 1, small-batch DPO/RL): 20-40% log noise on a learning curve.
    # The noise grid is this test's own: the default one stops at 10%.
    assert severe(feed(records(shapes.learning(length, scale, noise, seed)))) == []


def test_very_short_runs_are_silent() -> None:
    for seed in range(20):
        assert kinds(feed(records(noisy(4, sigma=0.1, seed=seed)))) == []


@pytest.mark.parametrize("ratio", [4.0, 20.0])
@pytest.mark.parametrize(shapes.GRID, shapes.grid())
def test_high_first_loss_then_fast_drop_is_healthy(
    scale: float, noise: float, length: int, seed: int, ratio: float
) -> None:
    # The first logged loss 4x or 20x the settled one, gone in two or three points: no spike,
    # no collapse (the drop is steep but lands on a healthy level), no plateau afterwards.
    losses = shapes.high_first(length, scale, noise, seed, ratio)
    assert severe(feed(records(losses, interval=10))) == []


def test_lr_warmup_bump_is_healthy() -> None:
    losses = [2.0 * (1 + 0.04 * math.sin(math.pi * i / 30)) for i in range(30)] + noisy(200, decay=0.01)
    lr = [1e-4 * min(1.0, (i + 1) / 30) for i in range(len(losses))]
    assert kinds(feed(records(losses, lr=lr))) == []


@pytest.mark.parametrize("with_epoch", [True, False])
@pytest.mark.parametrize("epochs", [3, 5])
@pytest.mark.parametrize(shapes.GRID, shapes.grid())
def test_epoch_staircase_is_healthy(
    scale: float, noise: float, length: int, seed: int, epochs: int, with_epoch: bool
) -> None:
    # Multi-epoch fine-tuning: the level steps down 0.7x at each boundary, nearly flat between.
    # A step down is no anomaly, whether or not the log says where the epochs are. (The run opens
    # with the fast fall real runs have: a first epoch flat from its very first point, under 5% in
    # its first 200 steps, is a plateau by that rule's definition, and is called one.)
    losses, epoch_of = shapes.staircase(length, scale, noise, seed, epochs)
    recs = records(losses, epochs=epoch_of if with_epoch else None)
    assert severe(feed(recs)) == []


@pytest.mark.parametrize("epochs", [3, 6])
@pytest.mark.parametrize(shapes.GRID, shapes.grid())
def test_epoch_periodic_sawtooth_is_healthy_with_the_epoch_field(
    scale: float, noise: float, length: int, seed: int, epochs: int
) -> None:
    # Data in a fixed order: the loss falls 1.5x through each epoch and jumps back at the boundary.
    losses, epoch_of = shapes.epoch_sawtooth(length, scale, noise, seed, epochs)
    assert severe(feed(records(losses, epochs=epoch_of))) == []


# A run that learns fast in its first epoch was far higher at every phase of it than it is in the
# second: the previous epoch's level at the same phase excuses only the jump back up at the restart,
# not a spike after the new epoch's points came down to the level.
@pytest.mark.parametrize("epochs", [3, 5])
@pytest.mark.parametrize("into", [4, 6])
@pytest.mark.parametrize(
    shapes.GRID, shapes.grid(noises=(0.005, 0.03), lengths=(60, 120), skip=lambda s, n, length, r: False)
)
def test_a_spike_early_in_a_later_epoch_of_a_fast_learning_run_is_a_spike(
    scale: float, noise: float, length: int, seed: int, epochs: int, into: int
) -> None:
    losses = shapes.learning(length, scale, noise, seed, fall=1.5)
    epoch_of = [epochs * (i + 1) / length for i in range(length)]
    at = next(i for i, e in enumerate(epoch_of) if e > 1.0) + into
    losses[at] *= 2.5
    got = raised(feed(records(losses, epochs=epoch_of)))
    assert [(a.kind, a.start_step) for a in got] == [("loss_spike", at + 1)]


# Without the epoch field the jump back (1.35x: log 0.30) is, honestly, a spike: the field is what
# explains it. It can be told from noise only where it is well above the spike threshold (7 sigma:
# noise <= 0.03 puts it at 10 sigma or more) and where an epoch holds 100 points or more (the 1200-point
# runs): the level is the median of the last 8 points, so in a short epoch it lags the fall and the
# jump above it shrinks (at 20 points an epoch to 1.23x, under the 1.25x minimum).
@pytest.mark.parametrize("epochs", [3, 6])
@pytest.mark.parametrize(
    shapes.GRID, shapes.grid(noises=(0.005, 0.03), skip=lambda s, n, length, r: length < 600)
)
def test_epoch_periodic_sawtooth_without_the_epoch_field_is_a_spike_at_a_boundary(
    scale: float, noise: float, length: int, seed: int, epochs: int
) -> None:
    losses, _ = shapes.epoch_sawtooth(length, scale, noise, seed, epochs)
    got = raised(feed(records(losses)))
    boundaries = {i + 1 for i in shapes.epoch_starts(length, epochs)}
    # Every jump back up is a spike, within two points of its boundary: without the epoch field
    # nothing tells the sawtooth from a jump (borderline first boundaries may pass unflagged).
    assert got and got[0].kind == "loss_spike"
    assert {a.kind for a in got} <= {"loss_spike", "divergence"}
    # A spike is dated where it began; the divergence it turns into names that start as since_step.
    began = [a.evidence.get("since_step", a.start_step) for a in got]
    assert all(s - max(b for b in boundaries if b <= s) <= 2 for s in began)


# A DPO loss has no scale of its own (it starts at ln 2 by construction): the grid is the spread of
# the per-batch reward margin (its noise), the length and the seed. Spreads stop at 2.5: wider,
# single batches reach margins over 14, a loss under 1e-6 that the collapse rule rightly calls zero;
# and the margin grows over 30 points at least, since a loss falling 20x to under 0.05 within two or
# three logged points is the sudden drop the collapse rule is there for.
@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("length", shapes.LENGTHS)
@pytest.mark.parametrize("spread", [0.5, 1.5, 2.5])
def test_dpo_loss_is_healthy(spread: float, length: int, seed: int) -> None:
    losses = shapes.dpo(length, seed, spread)
    # A DPO trainer logs its reward margins with the loss (TRL: rewards/margins); they mark the
    # objective, whose loss heads for zero by design.
    margins = [{"rewards/margins": -math.log(math.expm1(x)) if x > 1e-12 else 30.0} for x in losses]
    assert severe(feed(records(losses, extra=margins))) == []


def test_a_loss_only_log_falling_to_almost_nothing_is_a_collapse_warning() -> None:
    losses = shapes.dpo(1200, 0, 2.5)
    got = [a for a in severe(feed(records(losses))) if a[0] == "loss_collapse"]
    assert got and all(sev == "warning" for _k, _s, sev in got)


def test_irregular_logging_intervals_are_healthy() -> None:
    import random

    rng = random.Random(5)
    recs = records(noisy(400, sigma=0.04, decay=0.005))
    step = 0
    for i, r in enumerate(recs):
        step += rng.randint(1, 25)
        recs[i] = r.__class__(**{**r.__dict__, "step": step})
    assert kinds(feed(recs)) == []


def test_snippets_with_gaps_restart_the_baseline() -> None:
    # A log made of snippets: a level change across a 3000-step gap is drift, not a spike.
    losses = noisy(20, level=2.0, sigma=0.01) + noisy(20, level=3.5, sigma=0.01, seed=9)
    recs = records(losses)
    recs = recs[:20] + [r.__class__(**{**r.__dict__, "step": r.step + 3000}) for r in recs[20:]]
    assert kinds(feed(recs)) == []


def test_a_loss_near_zero_now_and_then_is_no_collapse_until_it_stays_there() -> None:
    """A batch-size-1 reward model near full accuracy: its loss (1 - margin) reads 0.0 or 0.004 on
    about 6 % of its steps, one at a time at first, later now and then three in a row. At that
    rate chance gives runs that long; a collapse stays down, and is raised once its run is longer
    than chance would give. (The first run of two, before any single was seen, would be raised.)"""
    import random

    rng = random.Random(11)
    losses = [max(0.06, 1.0 - 0.62 * i / 300 + rng.gauss(0, 0.1)) for i in range(300)]  # learning
    while len(losses) < 3000:
        if rng.random() < 0.06:
            run = 1 if len(losses) < 800 else rng.choice((1, 1, 1, 2, 3))  # singles first
            losses += [rng.choice((0.0, 0.00390625))] * run + [max(0.06, rng.gauss(0.38, 0.15))]
        else:
            losses.append(max(0.06, rng.gauss(0.38, 0.15)))
    losses = losses[:3000]
    assert "loss_collapse" not in kinds(feed(records(losses)))
    collapsed = raised(feed(records(losses + [0.0] * 40)))
    assert [(a.kind, a.start_step) for a in collapsed if a.kind == "loss_collapse"] == [
        ("loss_collapse", 3001)
    ]
