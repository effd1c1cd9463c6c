"""Loss detectors on small exact series: the right kind at the right step, silence on healthy shapes."""

from __future__ import annotations

import math

from tests.unit.detect.helpers import feed, kinds, noisy, raised, records


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
    assert states == [("raised", "loss_spike"), ("resolved", "loss_spike")]
    assert ts[1].anomaly.end_step == 51


def test_spike_that_stays_up_becomes_divergence() -> None:
    losses = noisy(80, sigma=0.02)
    for i in range(50, 80):
        losses[i] *= 4.0
    got = raised(feed(records(losses)))
    assert [(a.kind, a.start_step) for a in got] == [("loss_spike", 51), ("divergence", 53)]
    assert got[1].severity == "critical"


def test_slow_climb_is_divergence() -> None:
    losses = noisy(200, sigma=0.02, decay=0.03)
    for i in range(100, 200):
        losses[i] *= 2.0 ** ((i - 100) / 25)
    got = raised(feed(records(losses)))
    assert [a.kind for a in got] == ["divergence"]
    assert 100 < got[0].start_step < 140


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


def test_noisy_batch_size_one_losses_are_silent() -> None:
    # Per-sample losses: 30% log noise, no spike among 3000 points of it.
    assert kinds(feed(records(noisy(3000, level=0.8, sigma=0.3, seed=3, decay=0.002)))) == []


def test_very_short_runs_are_silent() -> None:
    for seed in range(20):
        assert kinds(feed(records(noisy(4, sigma=0.1, seed=seed)))) == []


def test_high_first_loss_then_fast_drop_is_healthy() -> None:
    losses = [14.7, 1.2, 0.77, 0.89, 0.79, 0.71, *noisy(60, level=0.7, sigma=0.05)]
    assert kinds(feed(records(losses, interval=50))) == []


def test_lr_warmup_bump_is_healthy() -> None:
    losses = [2.0 * (1 + 0.04 * math.sin(math.pi * i / 30)) for i in range(30)] + noisy(200, decay=0.01)
    lr = [1e-4 * min(1.0, (i + 1) / 30) for i in range(len(losses))]
    assert kinds(feed(records(losses, lr=lr))) == []


def test_epoch_staircase_is_healthy() -> None:
    losses, epochs = [], []
    for e in range(5):
        base = 1.5 * 0.7**e
        seg = noisy(100, level=base, sigma=0.05, seed=e)
        losses += [x * (1 - 0.05 * i / 100) for i, x in enumerate(seg)]
        epochs += [e + i / 100 for i in range(100)]
    assert kinds(feed(records(losses, epochs=epochs))) == []


def test_epoch_periodic_sawtooth_is_healthy_with_the_epoch_field() -> None:
    # Data in a fixed order: the loss falls through each epoch and jumps back at the boundary.
    losses, epochs = [], []
    for e in range(6):
        seg = noisy(50, level=1.0 * 0.9**e, sigma=0.01, seed=e)
        losses += [x * (1.5 - 0.5 * i / 50) for i, x in enumerate(seg)]
        epochs += [e + i / 50 for i in range(50)]
    assert kinds(feed(records(losses, epochs=epochs))) == []
    # Without the epoch field the same jump is, honestly, a spike: the field is what explains it.
    assert "loss_spike" in kinds(feed(records(losses)))


def test_dpo_loss_is_healthy() -> None:
    import random

    rng = random.Random(4)
    losses = [math.log(2.0)] * 3
    for i in range(3, 400):
        t = min(1.0, i / 120)
        margin = rng.gauss(3.0 * t, 0.05 + 2.5 * t)
        losses.append(math.log1p(math.exp(-margin)))
    assert kinds(feed(records(losses))) == []


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
