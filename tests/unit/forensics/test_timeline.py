"""replay's engine: the supervisor's feeding rules over recorded records."""

from __future__ import annotations

import math

from steadytune.forensics.timeline import Entry, Replayer, anomaly_keys, first_difference
from steadytune.records import Event, StepRecord


def steps(losses, attempt=0, start=1, t0=0.0):
    return [StepRecord(step=start + i, ts=t0 + i, attempt=attempt, loss=v, grad_norm=1.0, step_time_s=1.0, tokens=100)
            for i, v in enumerate(losses)]


def test_nan_loss_is_raised_and_resolved_like_live():
    r = Replayer()
    healthy = [3.0 - 0.05 * i + 0.02 * (-1) ** i for i in range(16)]
    for rec in steps([*healthy[:10], math.nan, *healthy[10:]]):
        r.feed(rec)
    assert anomaly_keys(r.entries) == [("anomaly", "nan_loss", 11), ("resolved", "nan_loss", 11)]


def test_worker_reports_are_filed_as_they_came():
    r = Replayer()
    r.feed(Event(ts=1.0, kind="action", name="skip_step", step=4, severity="warning", data={"consecutive": 1}))
    assert [e.key for e in r.entries] == [("action", "skip_step", 4)]


def test_after_a_rollback_nothing_is_fed_until_the_next_attempt_and_detection_restarts():
    from steadytune.detect.live import LiveDetector

    r = Replayer()
    r.pending = "rollback"
    first = r.detector
    r.feed(steps([math.nan])[0])  # the dying worker's last record: ignored
    assert r.entries == [] and r.detector is first
    r.feed(steps([2.0], attempt=1, start=5, t0=10.0)[0])
    assert r.pending is None and r.detector is not first and isinstance(r.detector, LiveDetector)


def test_first_difference():
    a = [("anomaly", "x", 1), ("resolved", "x", 2)]
    assert first_difference(a, list(a)) is None
    assert first_difference(a, a[:1]) == 1
    assert first_difference(a, [a[0], ("resolved", "x", 3)]) == 1
    assert Entry("anomaly", "x", 1).key == ("anomaly", "x", 1)
