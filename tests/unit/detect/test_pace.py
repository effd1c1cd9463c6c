"""Throughput, data loader, stragglers and stalls; the time is always passed in."""

from __future__ import annotations

import math
import random

import pytest

from steadytune.config.detect import DetectConfig, PaceConfig
from steadytune.detect import LiveDetector
from steadytune.records import StepRecord
from tests.unit.detect.helpers import feed, kinds, noisy, raised, records


def _times(n: int, base: float = 0.5, slow_from: int | None = None, factor: float = 3.0) -> list[float]:
    return [
        base * (factor if slow_from is not None and i >= slow_from else 1.0) * (1 + 0.03 * (i % 5))
        for i in range(n)
    ]


def test_lasting_slowdown_is_a_throughput_drop() -> None:
    n = 100
    cfg = DetectConfig(pace=PaceConfig(throughput_min_s=0))  # the point rule alone
    got = raised(
        feed(records(noisy(n, decay=0.02), step_time_s=_times(n, slow_from=60), tokens=[4096] * n), cfg)
    )
    drop = next(a for a in got if a.kind == "throughput_drop")
    assert drop.metric == "tokens_per_s" and 60 < drop.start_step <= 66
    assert drop.evidence["ratio"] < 0.5


def test_a_slowdown_must_also_last_in_wall_time() -> None:
    # The helper's records are 1 s apart: 10 slow points are 10 s, under the 20 s default.
    n = 100
    times = _times(n)
    for i in range(60, 70):
        times[i] *= 3
    assert "throughput_drop" not in kinds(
        feed(records(noisy(n, decay=0.02), step_time_s=times, tokens=[4096] * n))
    )
    got = raised(feed(records(noisy(n, decay=0.02), step_time_s=_times(n, slow_from=60), tokens=[4096] * n)))
    drop = next(a for a in got if a.kind == "throughput_drop")
    assert 60 + 20 <= drop.start_step <= 60 + 22


def test_one_slow_step_a_checkpoint_save_is_not_a_drop() -> None:
    n = 100
    times = _times(n)
    times[50] *= 20
    assert kinds(feed(records(noisy(n, decay=0.02), step_time_s=times))) == []


def test_waiting_for_data_is_a_dataloader_bottleneck() -> None:
    n = 60
    times = _times(n)
    extra = [{"data_time_s": 0.02 * t} if i < 30 else {"data_time_s": 0.6 * t} for i, t in enumerate(times)]
    got = raised(feed(records(noisy(n, decay=0.02), step_time_s=times, extra=extra)))
    assert [(a.kind, a.start_step) for a in got] == [("dataloader_bottleneck", 35)]


def _ranks(n: int, slow_rank: int | None, slow_from: int = 0, ranks: int = 4) -> list[StepRecord]:
    out = []
    for i in range(n):
        for r in range(ranks):
            t = 1.0 + 0.01 * r + 0.005 * (i % 3)
            if r == slow_rank and i >= slow_from:
                t *= 2.0
            out.append(
                StepRecord(
                    step=i + 1,
                    ts=float(i),
                    rank=r,
                    loss=2.0 - 0.001 * i,
                    step_time_s=t,
                    extra={"compute_time_s": t},
                )
            )
    return out


def test_slow_rank_is_a_straggler_named_by_rank() -> None:
    got = raised(feed(_ranks(80, slow_rank=2, slow_from=40)))
    straggler = next(a for a in got if a.kind == "straggler")
    assert straggler.rank == 2 and straggler.evidence["ratio"] > 1.8
    # That rank's own throughput fell too; the other ranks are left alone.
    assert {a.rank for a in got} == {2}


def test_even_ranks_are_no_stragglers() -> None:
    assert kinds(feed(_ranks(80, slow_rank=None))) == []


def _jittered_ranks(
    rng: random.Random, n: int, ranks: int, slow: dict[int, float], slow_points: set[int]
) -> list[StepRecord]:
    """Per-rank compute times with 5% jitter; each ``slow`` rank that many times slower at ``slow_points``."""
    out = []
    for i in range(n):
        for r in range(ranks):
            t = 0.5 * math.exp(rng.gauss(0, 0.05)) * (slow.get(r, 1.0) if i in slow_points else 1.0)
            out.append(
                StepRecord(
                    step=i + 1, ts=float(i), rank=r, loss=2.0, step_time_s=t, extra={"compute_time_s": t}
                )
            )
    return out


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("ranks", (2, 4, 8))
@pytest.mark.parametrize("factor", (1.6, 2.5))  # 1.6: a fifth over straggler_ratio, 4x the jitter
def test_a_rank_that_turns_slow_is_named_after_straggler_points(seed: int, ranks: int, factor: float) -> None:
    rng = random.Random(seed * 100 + ranks)
    slow_rank, i0, need = rng.randrange(ranks), rng.randint(30, 60), PaceConfig().straggler_points
    det, when = LiveDetector(), None
    for rec in _jittered_ranks(rng, i0 + 40, ranks, {slow_rank: factor}, set(range(i0, i0 + 40))):
        for t in det.observe_step(rec):
            if t.state == "raised" and t.anomaly.kind == "straggler" and when is None:
                when, got = rec.step, t.anomaly
    assert when is not None, "the slow rank was missed"
    # With two ranks the yardstick is the other rank alone, not a median that moves halfway.
    assert got.rank == slow_rank and got.start_step == i0 + 1
    assert when <= i0 + need, f"raised at step {when}, {when - i0} points after the rank turned slow"
    assert got.evidence["ratio"] > 0.8 * factor


@pytest.mark.parametrize("ranks", (2, 4))
def test_slow_steps_that_do_not_last_are_no_straggler(ranks: int) -> None:
    # A checkpoint save on one rank, or a few slow batches, break before straggler_points.
    rng = random.Random(ranks)
    need = PaceConfig().straggler_points
    slow = {i for start in range(20, 190, 30) for i in range(start, start + rng.randint(1, need - 1))}
    recs = _jittered_ranks(rng, 200, ranks, {0: 3.0}, slow)
    assert "straggler" not in kinds(feed(recs))


@pytest.mark.parametrize("ranks", (2, 4, 8))
@pytest.mark.parametrize("factor", (1.6, 2.5))
def test_every_rank_slowing_at_once_is_no_straggler(ranks: int, factor: float) -> None:
    # Longer batches, a slower phase of the data, a throttled node of all ranks: every rank is
    # slower from one step on. The yardstick (the others' latest times) moves with them.
    rng = random.Random(ranks)
    i0 = rng.randint(30, 60)
    slow = {k: factor for k in range(ranks)}
    assert "straggler" not in kinds(feed(_jittered_ranks(rng, i0 + 60, ranks, slow, set(range(i0, i0 + 60)))))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("interval", (10, 20, 50))
def test_irregular_logging_in_lockstep_is_no_lag(seed: int, interval: int) -> None:
    # Steps logged 1..2k+1 apart, every rank at every step. The first advances can be small by
    # chance (here: 1 and 2 steps); the next ordinary one must not make the ranks that have not
    # reported it yet look several logging intervals behind.
    rng = random.Random(seed)
    out, step = [], 0
    for i in range(60):
        step += (1, 2)[i - 1] if i in (1, 2) else rng.randint(interval, 2 * interval + 1)
        for r in range(4):
            out.append(StepRecord(step=step, ts=float(i), rank=r, loss=2.0, step_time_s=1.0))
    assert "straggler" not in kinds(feed(out))


def test_stall_from_time_then_resolved_by_the_next_step() -> None:
    det = LiveDetector()
    for i in range(20):
        assert det.observe_step(StepRecord(step=i + 1, ts=100.0 + i, loss=2.0 - 0.01 * i)) == []
    assert det.observe_time(200.0, 199.0, 20) == []  # 80 s without a step: fine
    got = det.observe_time(500.0, 499.0, 20)  # 380 s: over the 300 s floor
    assert [(t.state, t.anomaly.kind, t.anomaly.metric, t.anomaly.severity) for t in got] == [
        ("raised", "stall", "step", "critical")
    ]
    assert det.observe_time(600.0, 599.0, 20) == []  # raised once, not every tick
    back = det.observe_step(StepRecord(step=21, ts=610.0, loss=1.8))
    assert [(t.state, t.anomaly.kind) for t in back] == [("cleared", "stall")]


def test_silent_heartbeat_is_a_hang() -> None:
    det = LiveDetector()
    det.observe_step(StepRecord(step=1, ts=10.0, loss=2.0))
    got = det.observe_time(200.0, 50.0, 1)
    assert [(t.anomaly.kind, t.anomaly.metric) for t in got] == [("stall", "heartbeat")]
    assert [t.state for t in det.observe_time(210.0, 209.0, 1)] == ["cleared"]


def test_stall_limit_grows_with_slow_steps() -> None:
    det = LiveDetector()
    for i in range(10):
        det.observe_step(StepRecord(step=i + 1, ts=i * 200.0, loss=2.0))
    # Steps take 200 s: waiting 600 s is normal, 1100 s (over 5x) is not.
    assert det.observe_time(1800.0 + 600.0, None, 10) == []
    assert [t.anomaly.kind for t in det.observe_time(1800.0 + 1100.0, None, 10)] == ["stall"]


def test_the_time_a_restart_took_sets_no_hang_limit() -> None:
    """A resumed run's history holds steps of several attempts (replayed into a new detector after each
    restart): the minute between the last step of one and the first of the next is no step interval."""
    det = LiveDetector(DetectConfig(pace={"hang_floor_s": 6.0}))
    ts = 100.0
    for attempt in range(3):
        for i in range(10):
            det.observe_step(StepRecord(step=attempt * 10 + i + 1, ts=ts, loss=2.0, attempt=attempt))
            ts += 0.5
        ts += 60.0  # the restart
    last = ts - 60.0 - 0.5
    assert det.observe_time(last + 5.0, last + 0.5, 30) == []  # 4.5 s of silence: under the 6 s floor
    got = det.observe_time(last + 8.0, last + 0.5, 30)  # 7.5 s: a hang (10 x the 0.5 s pace is 5 s)
    assert [(t.anomaly.kind, t.anomaly.metric) for t in got] == [("stall", "heartbeat")]
