"""The seeded generator, and the whole engine on a small sample of it (the benchmark runs thousands)."""

from __future__ import annotations

import bisect

import pytest

from steadytune.detect import DetectConfig, LiveDetector
from steadytune.detect.faults import ACCEPT, FAULT_KINDS, make_fault
from steadytune.detect.synthetic import HEALTHY_SHAPES, base_run, healthy_runs, replay, to_events


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


K = 5  # a detection counts when raised within K units of the evidence its rule needs, as in the benchmark

# Kinds whose rules count system samples or evaluations rather than logged steps: K is in those.
SAMPLES = frozenset({"gpu_thermal", "gpu_error", "disk_low"})
EVALS = frozenset({"overfitting"})


def need(kind: str, run) -> int:
    """Units after the injection before the rule can raise by definition (its window); 0 for one-point
    rules."""
    c = DetectConfig()
    if kind == "plateau":
        # Flat from the first point: judged plateau_min_points after the warm-up and twice the warm-up's
        # steps after its end, and not before min_steps; shown flat there (within K points), it is called
        # once shown flat again after the span since the first step has tripled (sooner where the fit
        # is precise).
        warm = run.lr.index(max(run.lr))
        end = run.steps[warm - 1] if warm else run.steps[0]  # the LR last rose at the warm-up's last step
        after = end + 2 * (end - run.steps[0])
        first = next(i for i, s in enumerate(run.steps) if s >= max(c.loss.plateau_min_steps, after))
        judged = run.steps[min(len(run.steps) - 1, max(warm + c.loss.plateau_min_points, first) + K)]
        tripled = run.steps[0] + 3 * (judged - run.steps[0])
        return next((i for i, s in enumerate(run.steps) if s >= tripled), len(run.steps))
    return {
        "oscillation": c.loss.oscillation_window,
        "memory_leak": c.memory.window,
        "grad_vanishing": c.grad.vanishing_points + c.series.level_window,
        "throughput_drop": c.pace.throughput_points,
        "dataloader_bottleneck": c.pace.data_wait_points,
        "straggler": c.pace.straggler_points,
        "gpu_thermal": c.system.gpu_temp_points,
        "divergence": c.loss.divergence_points + c.series.level_window,
        "overfitting": c.eval.rising_evals,
    }.get(kind, 0)


def first_catch(f) -> tuple[str, int, int] | None:
    """The first accepted alarm that begins inside the injected range (+- 2 logging intervals), with how
    many units after the injection it was raised: logged points, system samples or evaluations by kind."""
    run, iv = f.run, f.run.interval
    lo, hi = run.steps[f.start] - 2 * iv, run.steps[f.end] + 2 * iv
    t0 = run.times()[f.start]
    det, point, samples, evals = LiveDetector(), 0, 0, 0
    for kind, item in to_events(run):
        if kind == "step":
            point = bisect.bisect_left(run.steps, item.step)
            evals += item.rank == 0 and item.eval_loss is not None and point >= f.start
            transitions = det.observe_step(item)
        elif kind == "system":
            samples += item.ts >= t0
            transitions = det.observe_system(item)
        else:
            transitions = det.observe_time(*item)
        for t in transitions:
            a = t.anomaly
            accepted = a.kind in ACCEPT[f.kind] and a.severity != "info"
            if t.state == "raised" and accepted and lo <= a.start_step <= hi:
                late = samples if f.kind in SAMPLES else evals if f.kind in EVALS else point - f.start
                return a.kind, a.start_step, late
    return None


DRAWS = 2


class Late(AssertionError):
    """Caught, but after the bound (a miss is a plain AssertionError, so an xfail below cannot hide one)."""


# Draws caught later than the bound: real lateness of the detectors, kept visible here.
NOISY_SWINGS = (
    "swings of 0.6 <-> 2.6 with a period of about 10 in a noisy run are raised 58 points in, "
    "past oscillation_window + K = 37"
)
LATE = {("oscillation", 0): NOISY_SWINGS}
CASES = [
    pytest.param(kind, draw, marks=pytest.mark.xfail(strict=True, raises=Late, reason=LATE[kind, draw]))
    if (kind, draw) in LATE
    else (kind, draw)
    for kind in FAULT_KINDS
    for draw in range(DRAWS)
]


@pytest.mark.parametrize("kind, draw", CASES)
def test_each_injected_kind_is_caught_where_and_when_it_was_put(kind: str, draw: int) -> None:
    import random

    rng = random.Random(FAULT_KINDS.index(kind))
    for _ in range(draw + 1):
        f = make_fault(rng, kind)
    where = f"{kind} injected at step {f.run.steps[f.start]} of a {f.run.shape} run ({f.note})"
    caught = first_catch(f)
    assert caught is not None, f"{where} was missed"
    bound = need(kind, f.run) + K
    if caught[2] > bound:
        raise Late(f"{where} was raised {caught[2]} units after it, more than {bound}: {caught}")
