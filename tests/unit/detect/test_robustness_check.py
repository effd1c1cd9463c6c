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
