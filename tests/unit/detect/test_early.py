"""Rules without a baseline window (detect/early.py), on generated shapes over scale, noise and seed."""

from __future__ import annotations

import dataclasses
import math

import pytest

from steadytune.detect import DetectConfig
from tests.unit.detect import shapes
from tests.unit.detect.helpers import feed, final, raised, records, severe

SCALES, SEEDS = shapes.SCALES, shapes.SEEDS


def _climb(n: int, scale: float, noise: float, seed: int, per_point: float) -> list[float]:
    """A run that climbs from its first point: each logged loss ``per_point`` (log) above the last."""
    rng = shapes.rng_for(seed, "climb")
    return [scale * math.exp(per_point * i + rng.gauss(0.0, noise)) for i in range(n)]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("noise", (0.005, 0.03))
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("n", (4, 6, 10))
def test_a_short_run_that_climbs_from_its_first_point_diverged(n: int, scale: float, noise: float, seed: int):
    # Tripling within the first points (an LR far too high): no baseline window is needed.
    losses = _climb(n, scale, noise, seed, per_point=math.log(3.0) / 3)
    got = raised(feed(records(losses, interval=10)))
    assert [a.kind for a in got][:1] in (["divergence"], ["loss_spike"])
    assert any(a.kind == "divergence" and a.severity == "critical" and a.start_step <= 40 for a in got)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scale", SCALES)
def test_a_slight_warmup_rise_is_not_a_divergence(scale: float, seed: int) -> None:
    # Warm-up can lift the first losses a little (10-20% over a few points): far short of a climb.
    warm = _climb(4, scale, 0.01, seed, per_point=0.05)
    losses = warm + shapes.learning(60, warm[-1], 0.02, seed)
    assert severe(feed(records(losses))) == []


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("noise", (0.2, 0.3, 0.4))
def test_noisy_small_batch_starts_do_not_climb(noise: float, seed: int) -> None:
    # Three rises in a row happen by chance at batch size 1; their size is judged against the noise.
    for offset in range(20):
        losses = shapes.learning(40, 2.0, noise, 100 * seed + offset)
        assert [k for k, _s, _v in severe(feed(records(losses)))] == [], (noise, seed, offset)


def _memorizing(n: int, scale: float, seed: int, floor: float) -> list[float]:
    """A loss that falls smoothly from ``scale`` to ``floor`` x scale over the run (many epochs)."""
    rng = shapes.rng_for(seed, "memorize")
    return [
        scale * (floor + (1.0 - floor) * math.exp(-8.0 * i / n)) * math.exp(rng.gauss(0, 0.05))
        for i in range(n)
    ]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scale", SCALES)
def test_a_loss_fallen_to_almost_nothing_is_a_collapse_warning(scale: float, seed: int) -> None:
    floor = 0.002 / scale * 0.5  # ends near 0.001 nats, far under 1% of the start
    n = 300
    losses = _memorizing(n, scale, seed, floor)
    got = [a for a in raised(feed(records(losses, interval=10))) if a.kind != "plateau"]
    assert [a.kind for a in got] == ["loss_collapse"]
    assert got[0].severity == "warning" and "memoriz" in got[0].cause
    cfg = DetectConfig().loss
    began = max(scale, losses[0])  # where the run began: its first point when that is the higher
    assert got[0].evidence["level"] < min(cfg.collapse_memorized, cfg.collapse_fraction * began)


def _memorizing_logged(steps: int, every: int, scale: float, seed: int) -> list[float]:
    """One memorizing run (100x down in its first quarter, to about 0.001 nats), logged every ``every``."""
    rng = shapes.rng_for(seed, "memorize-logged")
    floor = 0.001 / scale
    tau = steps / 32
    return [
        scale * (floor + (1.0 - floor) * math.exp(-s / tau)) * math.exp(rng.gauss(0, 0.05))
        for s in range(0, steps, every)
    ]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("points", (300, 60, 30))
def test_a_collapse_by_falling_does_not_depend_on_the_logging_interval(
    points: int, scale: float, seed: int
) -> None:
    # The same run logged 300, 60 or 30 times: in the coarse logs the first eight points already
    # span most of the fall, so where the run began must be read from its first point, not from them.
    # (So coarse a log can make the fall look sudden, a drop: a critical collapse is a catch too.)
    steps = 3000
    losses = _memorizing_logged(steps, steps // points, scale, seed)
    got = [a for a in raised(feed(records(losses, interval=steps // points))) if a.kind != "plateau"]
    assert [a.kind for a in got] == ["loss_collapse"], [(a.kind, a.evidence) for a in got]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("began", (0.4, 1.0, 1.5))
@pytest.mark.parametrize("floor", (0.004, 0.012, 0.018))
def test_a_collapse_in_a_coarse_multi_epoch_log_whose_first_point_is_already_low(
    floor: float, began: float, seed: int
) -> None:
    # A long multi-epoch run logged every 500 steps: its first logged loss is the mean of 500 steps
    # that already hold most of the first fall (0.4-1.5 nats), and each epoch halves the loss until it
    # sits under 0.02 nats, with the jump back up at each epoch start. Under 0.02 nats is near zero
    # whatever the run began at; a tenfold fall is what says the run brought it there.
    rng = shapes.rng_for(seed, "coarse-memorize")
    epochs, points = 20, 80
    losses, epoch_of = [], []
    for i in range(points):
        e = epochs * (i + 1) / points
        level = max(floor, began * 0.5**e) * (1.3 if e % 1 < 0.1 else 1.0)
        losses.append(level * math.exp(rng.gauss(0.0, 0.1)))
        epoch_of.append(e)
    got = [a for a in raised(feed(records(losses, interval=500, epochs=epoch_of))) if a.kind != "plateau"]
    assert [(a.kind, a.severity) for a in got] == [("loss_collapse", "warning")], [
        (a.kind, a.start_step) for a in got
    ]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scale", SCALES)
def test_a_low_loss_that_is_not_a_tiny_fraction_is_healthy(scale: float, seed: int) -> None:
    # Long multi-epoch runs settle at 2-5% of their first loss (and above 0.05 nats): learning, not collapse.
    floor = max(0.03, 0.06 / scale)
    losses = _memorizing(300, scale, seed, floor)
    assert [k for k, _s, _v in severe(feed(records(losses, interval=10)))] == []


@pytest.mark.parametrize("seed", SEEDS)
def test_a_healthy_eval_loss_says_memorizing_is_not_a_collapse(seed: int) -> None:
    n = 300
    losses = _memorizing(n, 2.0, seed, 0.0005)
    evals = [1.2 if i % 25 == 0 else None for i in range(n)]  # flat, at its best: it generalizes
    recs = records(losses, interval=10, eval_loss=evals)
    assert [k for k, _s, _v in severe(feed(recs)) if k == "loss_collapse"] == []
    rising = [1.2 + 0.05 * (i // 25) if i % 25 == 0 else None for i in range(n)]
    got = [
        a for a in raised(feed(records(losses, interval=10, eval_loss=rising))) if a.kind == "loss_collapse"
    ]
    assert got and "eval loss rose" in got[0].cause


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("noise", (0.005, 0.03))
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("n", (5, 10))
def test_a_climb_is_one_divergence_judged_against_where_it_began(
    n: int, scale: float, noise: float, seed: int
) -> None:
    # Once the short-rise rule sees the climb, its points leave the baseline: the loss that keeps
    # climbing is the same divergence, not a spike at each point against the diverged level.
    losses = _climb(n, scale, noise, seed, per_point=math.log(3.0) / 3)
    recs = records(losses, interval=10)
    got = final(recs)
    assert [a.kind for a in got] == ["divergence"]
    assert got[0].end_step == recs[-1].step


def _climb_back_jump(scale: float, noise: float, seed: int, ratio: float, climb: bool) -> list[float]:
    """A snippet that climbs (or stays level) from its first point, is back at its start, then
    jumps ``ratio``x."""
    rng = shapes.rng_for(seed, "snippet")
    per_point = math.log(1.25) if climb else 0.0
    first = [scale * math.exp(per_point * i + rng.gauss(0.0, noise)) for i in range(5)]
    back = scale * math.exp(rng.gauss(0.0, noise))
    return [*first, back, back * ratio, scale * math.exp(rng.gauss(0.0, noise))]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("ratio", (1.7, 2.5))  # clear of the 1.5x a rise must reach (early_rise)
@pytest.mark.parametrize("noise", (0.005, 0.03))
@pytest.mark.parametrize("scale", SCALES)
def test_after_a_climb_came_back_a_jump_is_a_spike(
    scale: float, noise: float, ratio: float, seed: int
) -> None:
    # A segment that has diverged once is no evidence of a healthy young baseline: the loss back at
    # its start and jumping again is the instability recurring (pretraining logs with rollbacks).
    recs = records(_climb_back_jump(scale, noise, seed, ratio, climb=True), interval=10)
    got = final(recs)
    assert [a.kind for a in got] == ["divergence", "loss_spike"]
    assert got[0].end_step < recs[5].step and got[1].start_step == recs[6].step


def _gap_before(recs: list, i: int, intervals: int) -> list:
    """The records from ``i`` on moved ``intervals`` logging intervals later: a stretch the log lacks."""
    shift = intervals * (recs[1].step - recs[0].step)
    return recs[:i] + [dataclasses.replace(r, step=r.step + shift) for r in recs[i:]]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("gap", (8, 50))  # logging intervals missing before the loss is back
@pytest.mark.parametrize("ratio", (1.7, 2.0))
@pytest.mark.parametrize("noise", (0.005, 0.03))
@pytest.mark.parametrize("scale", SCALES)
def test_a_climb_that_came_back_across_a_gap_is_still_the_witness(
    scale: float, noise: float, ratio: float, gap: int, seed: int
) -> None:
    # Lines missing from a log (snippets, a coarser or irregular logger) hide steps, not what they
    # showed: a climb whose first point after the gap is back where it began came back, across the
    # gap, and is the witness when the loss jumps again. (A jump that is itself the first point
    # after a gap stays drift: there is no level to judge it by.)
    recs = _gap_before(records(_climb_back_jump(scale, noise, seed, ratio, climb=True), interval=10), 5, gap)
    got = final(recs)
    assert [a.kind for a in got] == ["divergence", "loss_spike"], [(a.kind, a.start_step) for a in got]
    assert got[1].start_step == recs[6].step
    # Without the climb the same gap leaves a young baseline its prior floor: nothing is raised.
    level = _gap_before(
        records(_climb_back_jump(scale, noise, seed, ratio, climb=False), interval=10), 5, gap
    )
    assert final(level) == []


def _run_gap_rises(scale: float, noise: float, seed: int) -> list:
    """A run of 200 points, 50 logging intervals missing, then a snippet that rises three times
    by even steps (1.66x in all) before settling back."""
    rng = shapes.rng_for(seed, "gap-rises")
    before = shapes.learning(200, scale, noise, seed)
    base = before[-1] * math.exp(-noise)
    snippet = [base * math.exp(0.17 * i) for i in range(4)]
    snippet += [base * math.exp(rng.gauss(0.0, noise)) for _ in range(30)]
    recs = records(before + snippet, interval=10)
    return _gap_before(recs, 200, 50)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("noise", (0.15, 0.3))  # per-step losses of small batches: 1.5-2x apart
@pytest.mark.parametrize("scale", SCALES)
def test_after_a_gap_three_rises_are_judged_against_the_runs_own_noise(
    scale: float, noise: float, seed: int
) -> None:
    # Each gap opens a snippet, and the climb-from-the-first-point rule is for a run with no noise
    # of its own yet. A run known to jump this much from batch to batch rises 1.66x in three
    # steps by chance after one gap or another (a gappy per-step log would alarm at every few).
    recs = _run_gap_rises(scale, noise, seed)
    assert [a for a in final(recs) if a.kind == "divergence"] == []


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scale", SCALES)
def test_after_a_gap_a_quiet_run_that_climbs_still_diverges(scale: float, seed: int) -> None:
    # The same snippet in a run whose noise is 1%: the climb stands far out of it (a chronicle of
    # a pretraining run, a snippet per incident).
    recs = _run_gap_rises(scale, 0.01, seed)
    got = [a for a in final(recs) if a.kind == "divergence"]
    assert got and got[0].start_step == recs[201].step


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("ratio", (1.7, 1.9))  # clear of the young floor (about 2.1x on six points)
@pytest.mark.parametrize("noise", (0.005, 0.03))
@pytest.mark.parametrize("scale", SCALES)
def test_without_a_climb_a_young_baseline_keeps_its_floor(
    scale: float, noise: float, ratio: float, seed: int
) -> None:
    # The same jump after six level points: a short baseline cannot tell it from a fat-tailed
    # point, so the prior floor holds (the rule above is conditional on the climb).
    recs = records(_climb_back_jump(scale, noise, seed, ratio, climb=False), interval=10)
    assert final(recs) == []


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("steps", ((0.15, 0.3, 0.15), (0.3, 0.15, 0.15), (0.1, 0.35, 0.15)))
def test_three_uneven_rises_at_batch_size_1_are_not_a_climb(
    steps: tuple[float, float, float], scale: float, seed: int
) -> None:
    # Three rises (1.8x in all) at the start of a batch-size-1 run: their scatter, the noise the
    # rule grants a steady climb, is known from three increments, that is with two degrees of
    # freedom once their mean is taken out, and is bounded one standard error up accordingly.
    start = [scale * math.exp(sum(steps[:i])) for i in range(4)]
    rest = [0.7 * start[-1], *shapes.learning(60, 0.7 * start[-1], 0.35, seed)]  # the fifth point falls
    assert "divergence" not in [k for k, _s, _v in severe(feed(records(start + rest)))]
