"""benchmarks/detection_robustness.py: its perturbations, and which labels they leave standing.

The check's figures are only as honest as its rule for a label that a perturbation took the
evidence of: such a label must be neither a catch nor a miss, and one that keeps it must move
with the steps. Generated runs, no file's numbers.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from steadytune.detect.scoring import Label
from tests.unit.detect import shapes
from tests.unit.detect.helpers import records

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

import detection_robustness as rob


def _spiky(n: int, at: int, seed: int) -> list:
    losses = shapes.learning(n, 2.0, 0.02, seed)
    losses[at] *= 3.0
    return records(losses, interval=10)


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("k", (2, 5, 10))
def test_a_spike_counts_only_where_its_point_and_a_level_before_it_are_kept(k: int, seed: int) -> None:
    recs = _spiky(200, 120, seed)
    peak = recs[120].step
    label = [Label("f", "positive", "spike", peak - 5, peak + 5)]
    variants = rob.decimate(k)(recs)
    assert len(variants) == k
    assert sorted(o for v in variants for o, _r in v) == [r.step for r in recs]  # the phases cover the log
    standing = [v for v in variants if rob.surviving(label, recs, v)[0]]
    assert len(standing) == 1 and peak in {o for o, _r in standing[0]}


def test_a_snippet_reduced_to_its_jump_holds_no_spike() -> None:
    # Two stretches far apart; the second, decimated down to the jump itself, has no level left.
    recs = _spiky(40, 31, 0)
    recs = recs[:20] + [r.__class__(**{**r.__dict__, "step": r.step + 5000}) for r in recs[20:]]
    peak = recs[31].step
    label = [Label("f", "positive", "spike", peak, peak)]
    only_jump = [(r.step, r) for r in recs if r.step < 1000 or r.step == peak]
    kept, lost = rob.surviving(label, recs, only_jump)
    assert kept == [] and lost == label
    with_level = [(r.step, r) for r in recs if r.step < 1000 or r.step in (recs[30].step, peak)]
    assert rob.surviving(label, recs, with_level)[0] == label


def test_a_nan_grad_norm_label_goes_with_the_grad_norm() -> None:
    recs = records(shapes.learning(30, 2.0, 0.02, 0), grads=[1.0] * 10 + [math.nan] + [1.0] * 19)
    label = [Label("f", "positive", "nan", recs[10].step, recs[10].step)]
    assert rob.surviving(label, recs, rob.no_grad(recs)[0]) == ([], label)
    assert rob.surviving(label, recs, rob.truncate(0.5)(recs)[0])[0] == label


def test_jittered_steps_keep_their_order_and_carry_the_labels() -> None:
    recs = _spiky(200, 120, 0)
    label = [Label("f", "positive", "spike", recs[119].step, recs[121].step)]
    for variant in rob.jitter(recs):
        steps = [r.step for _o, r in variant]
        assert steps == sorted(set(steps))
        (moved,), _lost = rob.surviving(label, recs, variant)
        new_peak = dict(variant)[recs[120].step].step
        assert moved.start < new_peak < moved.end


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("k", (2, 5, 10))
def test_averaging_logs_each_block_mean_at_its_last_step_over_every_phase(k: int, seed: int) -> None:
    n = 103  # not a multiple of any k: a partial block at the end
    recs = records(
        shapes.learning(n, 2.0, 0.1, seed), grads=shapes.grad_norms(n, 1.0, 0.2, seed), interval=10
    )
    variants = rob.average(k)(recs)
    assert len(variants) == k
    by_step = {r.step: r for r in recs}
    for variant in variants:
        steps = [r.step for _o, r in variant]
        assert steps == sorted(set(steps)) and steps[-1] == recs[-1].step
        first = 0
        for _o, r in variant:  # each point stands for the original points since the one before it
            block = [x for x in recs[first:] if x.step <= r.step]
            first += len(block)
            assert 1 <= len(block) <= k and block[-1] is by_step[r.step]
            assert r.loss == pytest.approx(sum(x.loss for x in block) / len(block))
            assert r.grad_norm == pytest.approx(sum(x.grad_norm for x in block) / len(block))
        assert first == n
    assert {len(v) for v in variants} >= {math.ceil(n / k)}


def _one_batch_spike(ratio: float, seed: int) -> tuple[list, list[Label]]:
    recs = records(shapes.learning(200, 2.0, 0.02, seed), interval=1)
    recs[120] = recs[120].__class__(**{**recs[120].__dict__, "loss": recs[120].loss * ratio})
    return recs, [Label("f", "positive", "spike", recs[120].step, recs[120].step)]


@pytest.mark.parametrize("seed", shapes.SEEDS)
@pytest.mark.parametrize("k", (2, 5, 10))
def test_an_averaged_spike_stands_only_while_its_block_still_jumps(k: int, seed: int) -> None:
    # A one-batch jump of r is 1 + (r - 1) / k of its block: 4x is still a jump at every k and phase;
    # 1.3x averaged over 5 or 10 points is a wiggle of 3-6%, under the smallest jump any rule calls a
    # spike, so the label is neither a catch nor a miss there (kept as is, every k-th point, it stands).
    for ratio, stands in ((4.0, True), (1.3, k == 2)):
        recs, label = _one_batch_spike(ratio, seed)
        for variant in rob.average(k)(recs):
            kept, lost = rob.surviving(label, recs, variant, averaged=True)
            assert (kept, lost) == ((label, []) if stands else ([], label)), (ratio, k)


@pytest.mark.parametrize("k", (2, 5, 10))
def test_a_nan_survives_averaging_in_its_block(k: int) -> None:
    n = 60
    recs = records(shapes.learning(n, 2.0, 0.02, 0), grads=[1.0] * 30 + [math.nan] + [1.0] * (n - 31))
    label = [Label("f", "positive", "nan", recs[30].step, recs[30].step)]
    for variant in rob.average(k)(recs):
        assert rob.surviving(label, recs, variant, averaged=True)[0] == label
        assert sum(1 for _o, r in variant if math.isnan(r.grad_norm)) == 1


def test_evaluations_pass_through_averaging() -> None:
    recs = records(shapes.learning(40, 2.0, 0.02, 0), interval=10)
    evals = [recs[0].__class__(step=s, ts=0.0, eval_loss=1.5) for s in (100, 200, 300)]
    mixed = sorted(recs + evals, key=lambda r: r.step)
    for variant in rob.average(5)(mixed):
        assert [(r.step, r.eval_loss) for _o, r in variant if r.loss is None] == [
            (s, 1.5) for s in (100, 200, 300)
        ]


@pytest.mark.parametrize("seed", shapes.SEEDS)
def test_an_averaged_wiggle_after_one_low_block_is_no_spike(seed: int) -> None:
    # Measured from the one block before it, a 1.05x block after a 0.9x dip would be a 1.17x jump.
    recs = records(shapes.flat(200, 2.0, 0.005, seed), interval=1)
    for i, f in ((118, 0.9), (119, 0.9), (120, 1.1)):
        recs[i] = recs[i].__class__(**{**recs[i].__dict__, "loss": recs[i].loss * f})
    label = [Label("f", "positive", "spike", recs[120].step, recs[120].step)]
    phase0 = rob.average(2)(recs)[0]
    assert rob.surviving(label, recs, phase0, averaged=True) == ([], label)
