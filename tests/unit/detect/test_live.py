"""The live engine: raise once, resolve once, the console line, config switches, ranks, offline parity."""

from __future__ import annotations

import dataclasses
import math

from steadytune.detect import DetectConfig, LiveDetector, Transition, detect, format_transition
from steadytune.records import Anomaly, StepRecord
from tests.unit.detect.helpers import feed, kinds, noisy, records


def _spiky() -> list[StepRecord]:
    losses = noisy(120, sigma=0.02, decay=0.02)
    losses[60] *= 3.0
    for i in range(90, 95):
        losses[i] *= 5.0
    return records(losses)


def test_each_anomaly_is_raised_once_and_resolved_once() -> None:
    """Cleared when its condition stops holding, resolved once quiet for the episode gap (16 intervals)."""
    ts = feed(_spiky())
    events = [(t.state, t.anomaly.kind, t.anomaly.start_step) for t in ts]
    assert events == [
        ("raised", "loss_spike", 61),
        ("cleared", "loss_spike", 61),
        ("resolved", "loss_spike", 61),
        ("raised", "loss_spike", 91),
        ("raised", "divergence", 93),
        ("cleared", "loss_spike", 91),
        ("cleared", "divergence", 93),
        ("resolved", "loss_spike", 91),
        ("resolved", "divergence", 93),
    ]
    resolved = {t.anomaly.kind: t.anomaly for t in ts if t.state == "resolved"}
    assert resolved["divergence"].end_step == 95


def test_a_long_anomaly_adds_no_transitions_while_it_lasts() -> None:
    losses = noisy(40, decay=0.05) + [math.nan] * 500
    ts = feed(records(losses))
    assert [(t.state, t.anomaly.kind) for t in ts] == [("raised", "nan_loss")]


def test_format_transition_says_what_where_cause_and_fix() -> None:
    a = Anomaly(
        "loss_spike", "warning", 61, 61, "loss", {"ratio": 3.1}, "a vertical jump", "clip and lower the LR"
    )
    line = format_transition(Transition("raised", a))
    assert line.startswith("WARNING loss_spike at step 61")
    assert "ratio=3.1" in line and "a vertical jump" in line and "clip and lower the LR" in line
    done = format_transition(Transition("resolved", a))
    assert done.startswith("resolved loss_spike") and "61-61" in done


def test_disabled_kinds_and_disabled_detection() -> None:
    cfg = DetectConfig.model_validate({"disabled_kinds": ["loss_spike"]})
    assert kinds(feed(_spiky(), cfg)) == ["divergence"]
    assert feed(_spiky(), DetectConfig(enabled=False)) == []


def test_thresholds_come_from_the_config() -> None:
    strict = DetectConfig.model_validate(
        {"loss": {"spike_z": 60.0, "spike_min_ratio": 10.0, "divergence_points": 50}}
    )
    assert kinds(feed(_spiky(), strict)) == []


def test_training_signal_is_judged_on_the_primary_rank_only() -> None:
    recs = []
    for r in _spiky():
        recs.append(r)
        recs.append(StepRecord(step=r.step, ts=r.ts, rank=1, loss=(r.loss or 0) * 1.01))
    assert kinds(feed(recs)) == kinds(feed(_spiky()))


def test_offline_replay_equals_live_transitions() -> None:
    recs = _spiky()
    det = LiveDetector()
    live = [t.anomaly for r in recs for t in det.observe_step(r) if t.state == "resolved"]

    # The same episodes; only their causes may read differently, told with the whole run in hand
    # (detect.offline.in_hindsight, checked in test_explanations.py).
    def bare(found: list[Anomaly]) -> list[Anomaly]:
        return [dataclasses.replace(a, cause="") for a in found]

    live.sort(key=lambda a: (a.start_step, a.end_step, a.kind, a.metric))
    assert bare(detect(recs)) == bare(live)


def test_open_anomalies_are_reported_at_the_end_offline() -> None:
    losses = noisy(60, decay=0.05)
    losses[50:] = [0.0] * 10
    got = detect(records(losses))
    assert [(a.kind, a.start_step, a.end_step) for a in got] == [("loss_collapse", 51, 60)]
