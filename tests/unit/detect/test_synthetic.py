"""The seeded generator, and the whole engine on a small sample of it (the benchmark runs thousands)."""

from __future__ import annotations

import pytest

from steadytune.detect.faults import ACCEPT, FAULT_KINDS, make_fault
from steadytune.detect.synthetic import HEALTHY_SHAPES, base_run, healthy_runs, replay


def test_generator_is_reproducible() -> None:
    a, b = healthy_runs(seed=3, per_shape=1), healthy_runs(seed=3, per_shape=1)
    assert [r.loss for r in a] == [r.loss for r in b]
    assert [r.loss for r in healthy_runs(seed=4, per_shape=1)] != [r.loss for r in a]


@pytest.mark.parametrize("shape", HEALTHY_SHAPES)
def test_healthy_shapes_raise_no_warning(shape: str) -> None:
    import random

    rng = random.Random(11)
    for _ in range(2):
        run = base_run(rng, shape)
        bad = [
            (a.kind, a.start_step)
            for a, _ in replay(run)
            if a.severity == "critical" or (a.severity == "warning" and not _expected_skip(run, a))
        ]
        assert bad == [], f"{shape}: {bad}"


def _expected_skip(run, a) -> bool:
    """An fp16 overflow step the scaler skipped is worth a warning: that one is expected."""
    return run.shape == "fp16_skips" and a.kind == "nonfinite_grad"


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_each_injected_kind_is_caught_where_it_was_put(kind: str) -> None:
    import random

    rng = random.Random(FAULT_KINDS.index(kind))
    for _ in range(2):
        f = make_fault(rng, kind)
        lo = f.run.steps[f.start] - 2 * f.run.interval
        hits = [
            a
            for a, _ in replay(f.run)
            if a.kind in ACCEPT[kind] and a.start_step >= lo and a.severity != "info"
        ]
        assert hits, f"{kind} injected at step {f.run.steps[f.start]} ({f.note}) was missed"
