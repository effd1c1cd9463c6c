"""Plateau, oscillation and overfitting: shapes over windows, not single points."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from steadytune.detect import DetectConfig
from tests.unit.detect import shapes
from tests.unit.detect.helpers import feed, kinds, noisy, raised, records, severe

INTERVAL = 10


def _points_to_show_flat(noise: float) -> int:
    """Points before a flat line is shown flat: the fitted change's error (noise x sqrt(12/n)),
    4.5 of them (1.5 demanded, 3 of luck), must fit inside the 0.05 gain expected of learning."""
    cfg = DetectConfig().loss
    return max(cfg.plateau_min_points, math.ceil(12 * (4.5 * noise / cfg.plateau_min_gain) ** 2))


# 12 points (120 steps) are too few for any call (30 points and 200 steps first): there the test asserts
# silence. At 10% noise 120 points cannot show flatness (the fitted change's error, 0.03, is most of the
# 0.05 expected gain): that combination is left out.
@pytest.mark.parametrize(
    shapes.GRID,
    shapes.grid(skip=lambda s, n, length, r: length < _points_to_show_flat(n) and length >= 30),
)
def test_no_learning_from_the_start_is_a_plateau(scale: float, noise: float, length: int, seed: int) -> None:
    cfg = DetectConfig().loss
    got = raised(feed(records(shapes.flat(length, scale, noise, seed), interval=INTERVAL)))
    if length < cfg.plateau_min_points or length * INTERVAL < cfg.plateau_min_steps:
        assert got == []  # never on the first few points
        return
    assert [(a.kind, a.severity) for a in got] == [("plateau", "warning")]
    assert got[0].evidence["reason"] == "no learning since the start"
    # Called only once enough points have shown the flat line, and soon after that.
    earliest = max(cfg.plateau_min_points * INTERVAL, cfg.plateau_min_steps)
    assert earliest <= got[0].start_step <= INTERVAL * (_points_to_show_flat(noise) + 10)


def test_slow_learning_is_no_plateau() -> None:
    # 25% over the run, most of it in the first 150 points, under 5% noise.
    losses = [x * (0.75 + 0.25 * math.exp(-i / 150)) for i, x in enumerate(noisy(600, sigma=0.05))]
    assert kinds(feed(records(losses))) == []


def test_converged_run_flat_after_learning_is_no_plateau() -> None:
    losses = noisy(1000, sigma=0.02, decay=0.05)
    assert kinds(feed(records(losses))) == []


def test_noisy_flat_start_needs_more_points_before_a_plateau_is_called() -> None:
    # Under 30% noise 100 points cannot show flatness within 4%: the detector waits.
    assert kinds(feed(records(noisy(100, sigma=0.3, seed=2)))) == []


def test_flat_start_during_lr_warmup_is_not_judged() -> None:
    lr = [1e-5 * (i + 1) for i in range(100)]
    assert kinds(feed(records(noisy(100, sigma=0.02), lr=lr))) == []


def test_identical_values_are_a_frozen_model() -> None:
    losses = noisy(40, decay=0.05) + [1.2345] * 10
    got = raised(feed(records(losses)))
    assert [a.kind for a in got] == ["plateau"]
    assert got[0].start_step == 40 + 6 and got[0].evidence["reason"] == "identical loss values"


@pytest.mark.parametrize("scale", shapes.SCALES)
@pytest.mark.parametrize("seed", shapes.SEEDS)
def test_a_loss_that_moves_only_in_its_fifth_digit_is_a_frozen_model(scale: float, seed: int) -> None:
    # A model whose output does not depend on its batch (weights zeroed, uniform predictions): the
    # printed loss wanders by a thousandth of a percent, never the same float twice, for a short run
    # (fewer steps than a no-learning verdict waits for).
    rng = shapes.rng_for(seed, "frozen")
    losses = [scale * (1.0 + rng.gauss(0.0, 1e-5)) for _ in range(100)]
    got = raised(feed(records(losses)))
    assert [(a.kind, a.evidence["reason"]) for a in got] == [("plateau", "identical loss values")]
    assert got[0].start_step <= 10


@pytest.mark.parametrize(shapes.GRID, shapes.grid(lengths=(120, 1200)))
def test_a_coarsely_printed_loss_that_settles_on_one_value_is_not_frozen(
    scale: float, noise: float, length: int, seed: int
) -> None:
    # A logger (or a low-precision dtype) that keeps three significant digits: as the loss slows down
    # it sits on one printed value for a few points, then for longer as it converges. Repeats the series
    # has shown and broken are its texture: only a run of them far longer than any before is frozen.
    curve = shapes.learning(length, scale, noise / 10, seed, fall=0.6)
    losses = [float(f"{x:.3g}") for x in curve]
    got = raised(feed(records(losses)))
    assert [a for a in got if a.kind == "plateau"] == [], [(a.kind, a.start_step) for a in got]


@pytest.mark.parametrize(shapes.GRID, shapes.grid(lengths=(120, 1200)))
def test_a_flat_loss_in_a_log_that_begins_after_the_first_epoch_is_no_plateau(
    scale: float, noise: float, length: int, seed: int
) -> None:
    # A resumed run's log (or the second half of one): the loss is flat because the run converged
    # before the log began; "no learning since the start" cannot be said of it. From step 0 (the
    # control) the same flat loss is a plateau.
    losses = shapes.flat(length, scale, noise, seed)
    if length < _points_to_show_flat(noise):
        return
    resumed = records(losses, interval=INTERVAL, epochs=[1.0 + i / length for i in range(length)])
    assert kinds(feed(resumed)) == []
    late = [replace(r, step=r.step + 100 * INTERVAL) for r in records(losses, interval=INTERVAL)]
    assert kinds(feed(late)) == []
    assert kinds(feed(records(losses, interval=INTERVAL, epochs=[i / length for i in range(length)]))) == [
        "plateau"
    ]
    # An epoch counter printed from 1 ("Epoch [1/1]") is no sign of a late start: 1 from the first step.
    counter = records(losses, interval=INTERVAL, epochs=[1.0] * length)
    assert kinds(feed(counter)) == ["plateau"]


def _saw(n: int, start: int, period: int, amp: float) -> list[float]:
    losses = noisy(n, sigma=0.01, decay=0.02)
    level = losses[start]
    for i in range(start, n):
        losses[i] = level * math.exp(amp * math.sin(2 * math.pi * (i - start) / period))
    return losses


def test_lr_sawtooth_is_oscillation() -> None:
    got = raised(feed(records(_saw(300, 150, 8, 0.2))))
    assert "oscillation" in [a.kind for a in got]
    osc = next(a for a in got if a.kind == "oscillation")
    assert 150 < osc.start_step <= 150 + 40
    assert "LR" in osc.cause


def test_fast_zigzag_is_oscillation() -> None:
    assert "oscillation" in kinds(feed(records(_saw(300, 150, 4, 0.2))))


@pytest.mark.parametrize("period, amplitude", [(5, 0.08), (8, 0.08), (4, 0.15)])
@pytest.mark.parametrize(shapes.GRID, shapes.grid())
def test_sawtooth_present_from_the_start_is_texture_not_oscillation(
    scale: float, noise: float, length: int, seed: int, period: int, amplitude: float
) -> None:
    # Length-grouped or fixed-order batches: a regular saw from step one, the level falling.
    losses = shapes.texture_saw(length, scale, noise, seed, period, amplitude)
    assert severe(feed(records(losses, interval=10))) == []


def test_overfitting_when_eval_rises_while_train_falls() -> None:
    n = 200
    losses = noisy(n, sigma=0.01, decay=0.02)
    evals: list[float | None] = [None] * n
    for k, i in enumerate(range(9, n, 10)):
        evals[i] = 1.0 * (1.0 - 0.02 * k) if k < 8 else 0.86 * (1.0 + 0.04 * (k - 7))
    got = raised(feed(records(losses, eval_loss=evals)))
    assert [a.kind for a in got] == ["overfitting"]
    assert got[0].metric == "eval_loss"
    assert got[0].evidence["evals_above"] >= DetectConfig().eval.rising_evals


def test_eval_that_flattens_is_not_overfitting() -> None:
    n = 200
    evals: list[float | None] = [None] * n
    for k, i in enumerate(range(9, n, 10)):
        evals[i] = 0.8 + 0.2 * math.exp(-k / 4) + 0.002 * (-1) ** k
    assert kinds(feed(records(noisy(n, sigma=0.01, decay=0.02), eval_loss=evals))) == []


# Coarse logs: a point every 500 steps, an evaluation every one or two points, over 10k-40k steps. The
# eval loss bottoms at 30% or 50% of its evaluations and creeps up 10% or 20% in all by the end (at least
# ten evaluations after its best), eval noise 0.2-1%, one epoch or three; the training loss falls.
COARSE = [
    pytest.param(
        points,
        every,
        best_at,
        noise,
        epochs,
        seed,
        id=f"p{points}-e{every}-b{best_at}-n{noise}-{epochs}ep-r{seed}",
    )
    for points, every in ((20, 1), (40, 1), (80, 1), (40, 2), (80, 2))
    for best_at in (0.3, 0.5)
    for noise in (0.002, 0.005, 0.01)
    for epochs in (1, 3)
    for seed in shapes.SEEDS
]


@pytest.mark.parametrize("rise", (0.1, 0.2))
@pytest.mark.parametrize("points, every, best_at, noise, epochs, seed", COARSE)
def test_eval_loss_creeping_up_in_a_coarse_log_is_overfitting(
    points: int, every: int, best_at: float, noise: float, epochs: int, seed: int, rise: float
) -> None:
    losses, evals, epoch = shapes.coarse_eval(points, every, best_at, rise, noise, seed, epochs)
    got = raised(feed(records(losses, interval=500, eval_loss=evals, epochs=epoch)))
    assert [a.kind for a in got] == ["overfitting"], [(a.kind, a.start_step) for a in got]
    best = min(range(points), key=lambda i: evals[i] if evals[i] is not None else math.inf)
    assert got[0].start_step > (best + 1) * 500 and got[0].evidence["best_step"] == (best + 1) * 500


@pytest.mark.parametrize("points, every, best_at, noise, epochs, seed", COARSE)
def test_a_flat_noisy_eval_loss_in_a_coarse_log_is_not_overfitting(
    points: int, every: int, best_at: float, noise: float, epochs: int, seed: int
) -> None:
    # The best of dozens of evaluations with 1% noise is the luckiest, about 2% under the rest: two in a
    # row 3% above it are chance, not a rise. The rule asks for 4.5 of the evaluations' own noise.
    losses, evals, epoch = shapes.coarse_eval(points, every, best_at, 0.0, noise, seed, epochs)
    assert severe(feed(records(losses, interval=500, eval_loss=evals, epochs=epoch))) == []


@pytest.mark.parametrize("every", (1, 2))
@pytest.mark.parametrize("bad", ((0.5, None), (0.3, 0.6), (0.8, None)))
@pytest.mark.parametrize("seed", shapes.SEEDS)
def test_an_evaluation_whose_loss_is_nan_is_one_episode_while_training_is_finite(
    every: int, bad: tuple[float, float | None], seed: int
) -> None:
    """An SFT run whose eval loss turns NaN (an overflow on the eval's batches, an eval set whose labels
    are all masked) while its training loss stays finite: one `nan_eval` on `eval_loss`, from the first
    NaN evaluation, ended by the first finite one after it; finite evaluations raise nothing of it."""
    points = 60
    losses, evals, epoch = shapes.coarse_eval(points, every, 0.5, 0.0, 0.005, seed, 1)
    start, end = (int(f * points) if f is not None else points for f in bad)
    idx = [i for i in range(points) if evals[i] is not None]
    first_bad = next(i for i in idx if i >= start)
    healed = next((i for i in idx if i >= end), None)
    for i in idx:
        if start <= i < end:
            evals[i] = math.nan
    got = [t for t in feed(records(losses, interval=100, eval_loss=evals, epochs=epoch))
           if t.anomaly.kind == "nan_eval"]  # fmt: skip
    assert [(t.state, t.anomaly.metric) for t in got][:1] == [("raised", "eval_loss")]
    assert got[0].anomaly.start_step == (first_bad + 1) * 100
    assert "training loss is finite" in (got[0].anomaly.cause or "")
    assert sum(t.state == "raised" for t in got) == 1
    last_bad = max(i for i in idx if start <= i < end)
    resolved = [t for t in got if t.state == "resolved"]
    if healed is None:
        assert not resolved  # NaN to the end: still open when the run ends
    else:
        assert [t.anomaly.end_step for t in resolved] == [(last_bad + 1) * 100]
    clean = shapes.coarse_eval(points, every, 0.5, 0.0, 0.005, seed, 1)
    assert not [t for t in feed(records(clean[0], interval=100, eval_loss=clean[1], epochs=clean[2]))
                if t.anomaly.kind == "nan_eval"]  # fmt: skip
