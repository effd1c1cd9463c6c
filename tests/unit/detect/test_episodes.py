"""Episodes, not points: a condition that goes on or comes back is one anomaly, counted.

Every series here is generated: a healthy loss with a condition that flickers N
times, at several logging intervals; a memory share that crosses the warning and
then the critical line within one episode; conditions far enough apart to be two.
"""

from __future__ import annotations

import pytest

from steadytune.config.detect import DetectConfig
from steadytune.detect import LiveDetector, detect
from steadytune.detect.offline import replay
from steadytune.records import Anomaly, StepRecord, from_dict, to_dict
from tests.unit.detect.helpers import feed, noisy, records

GAP = DetectConfig().episode_gap_points


def _flicker(n: int, every: int, lead: int = 40, interval: int = 1, seed: int = 3) -> list[StepRecord]:
    """A healthy loss that reads exactly 0 for two points every ``every`` points after ``lead``,
    ``n`` times (one zero alone is no collapse)."""
    total = lead + n * every + 20
    losses = noisy(total, level=2.0, sigma=0.03, seed=seed, decay=0.01)
    for k in range(n):
        losses[lead + k * every] = losses[lead + k * every + 1] = 0.0
    return records(losses, interval=interval)


@pytest.mark.parametrize("interval", [1, 10, 500])
@pytest.mark.parametrize("n", [2, 7])
def test_zeros_every_tenth_point_are_one_collapse_counted_n_times(n: int, interval: int) -> None:
    recs = _flicker(n, every=10, interval=interval)
    ts = feed(recs)
    collapses = [t for t in ts if t.anomaly.kind == "loss_collapse"]
    assert [t.state for t in collapses if t.state == "raised"] == ["raised"]
    assert sum(t.state == "recurred" for t in collapses) == n - 1
    (episode,) = [a for a in detect(recs) if a.kind == "loss_collapse"]
    assert episode.count == n and episode.peak == 0.0 and episode.severity == "critical"
    assert (episode.start_step, episode.end_step) == (41 * interval, (41 + (n - 1) * 10) * interval)


def test_a_condition_quiet_past_the_gap_is_a_new_episode() -> None:
    every = GAP + 5  # further apart than the gap: each zero is its own episode
    recs = _flicker(3, every=every)
    found = [a for a in detect(recs) if a.kind == "loss_collapse"]
    assert [(a.start_step, a.count) for a in found] == [(41, 1), (41 + every, 1), (41 + 2 * every, 1)]


def test_the_gap_counts_logging_intervals_not_logged_points() -> None:
    """A log of snippets: two zeros twelve logged points apart, but thousands of steps, are two episodes."""
    losses = noisy(60, sigma=0.03, seed=5, decay=0.01)
    losses[20] = losses[21] = losses[32] = losses[33] = 0.0
    recs = records(losses)
    steps = [r.step if i < 25 else r.step + 5000 for i, r in enumerate(recs)]
    recs = [
        StepRecord(step=s, ts=float(i), loss=r.loss) for i, (s, r) in enumerate(zip(steps, recs, strict=True))
    ]
    found = [(a.start_step, a.count) for a in detect(recs) if a.kind == "loss_collapse"]
    assert found == [(21, 1), (5033, 1)]


def test_the_episode_ends_once_quiet_for_the_gap_with_its_count_and_peak() -> None:
    recs = _flicker(4, every=5)
    ts = feed(recs)
    states = [t.state for t in ts if t.anomaly.kind == "loss_collapse"]
    assert states[0] == "raised" and states[-1] == "resolved" and states.count("resolved") == 1
    assert states.count("cleared") == 4 and states.count("recurred") == 3
    last = next(t for t in ts if t.state == "resolved" and t.anomaly.kind == "loss_collapse")
    assert last.anomaly.count == 4 and last.anomaly.end_step == 41 + 15
    run = replay(recs)
    (i,) = [k for k, a in enumerate(run.anomalies) if a.kind == "loss_collapse"]
    assert run.firings[i] == (41, 46, 51, 56)


@pytest.mark.parametrize("every", [10, 37])
def test_a_lone_zero_now_and_then_is_no_collapse(every: int) -> None:
    """A placeholder ``avg_loss=0.0000`` printed every tenth step, or a reward model's 1 - margin
    rounding to 0.0 in bf16 now and then: single zeros between real values."""
    losses = noisy(40 + 49 * every + 20, level=2.0, sigma=0.03, seed=4, decay=0.01)
    for k in range(49):
        losses[40 + k * every] = 0.0
    assert [a for a in detect(records(losses)) if a.kind == "loss_collapse"] == []


def test_a_spike_that_returns_peaks_at_its_highest_point() -> None:
    losses = noisy(120, sigma=0.02, seed=8)
    losses[60] *= 3.0
    losses[66] *= 5.0  # back within the gap, higher
    (spike,) = [a for a in detect(records(losses)) if a.kind == "loss_spike"]
    assert spike.count == 2 and spike.start_step == 61 and spike.peak == pytest.approx(losses[66], rel=1e-5)


def test_severity_rising_mid_episode_is_one_episode_escalated() -> None:
    """Memory held creeps past the warning share, then the critical one: one episode, told twice."""
    total = 100 << 30
    shares = [0.80] * 10 + [0.94] * 5 + [0.95] * 3 + [0.99] * 4 + [0.80] * 30
    det = LiveDetector(DetectConfig.model_validate({"memory": {"device_total_bytes": total}}))
    ts = []
    for i, share in enumerate(shares):
        rec = StepRecord(step=i + 1, ts=float(i), loss=2.0, mem_reserved_bytes=int(share * total))
        ts += det.observe_step(rec)
    got = [
        (t.state, t.anomaly.severity, t.anomaly.start_step) for t in ts if t.anomaly.kind == "memory_headroom"
    ]
    assert got == [
        ("raised", "warning", 11),
        ("escalated", "critical", 11),
        ("cleared", "critical", 11),
        ("resolved", "critical", 11),
    ]
    assert [t.was for t in ts if t.state == "escalated"] == ["warning"]


def test_an_anomaly_written_before_episodes_reads_as_one_firing() -> None:
    new = Anomaly("loss_spike", "warning", 10, 12, "loss", {"value": 5.0}, count=3, peak=5.0)
    data = to_dict(new)
    assert from_dict(data) == new
    old = {k: v for k, v in data.items() if k not in ("count", "peak")}
    assert from_dict(old) == Anomaly("loss_spike", "warning", 10, 12, "loss", {"value": 5.0})
    assert from_dict(old).count == 1 and from_dict(old).peak is None
