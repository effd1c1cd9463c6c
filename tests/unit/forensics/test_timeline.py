"""replay's engine: the supervisor's feeding rules over recorded records."""

from __future__ import annotations

import math

from steadytune.forensics.timeline import Entry, Replayer, anomaly_keys, first_difference, recorded
from steadytune.records import Event, StepRecord


def steps(losses, attempt=0, start=1, t0=0.0):
    return [
        StepRecord(
            step=start + i, ts=t0 + i, attempt=attempt, loss=v, grad_norm=1.0, step_time_s=1.0, tokens=100
        )
        for i, v in enumerate(losses)
    ]


def test_nan_loss_is_raised_and_resolved_like_live():
    r = Replayer()
    # Resolved once quiet for the episode gap (16 logging intervals), as live.
    healthy = [3.0 - 0.05 * i + 0.02 * (-1) ** i for i in range(40)]
    for rec in steps([*healthy[:10], math.nan, *healthy[10:]]):
        r.feed(rec)
    assert anomaly_keys(r.entries) == [("anomaly", "nan_loss", 11), ("resolved", "nan_loss", 11)]


def test_worker_reports_are_filed_as_they_came():
    r = Replayer()
    r.feed(
        Event(ts=1.0, kind="action", name="skip_step", step=4, severity="warning", data={"consecutive": 1})
    )
    assert [e.key for e in r.entries] == [("action", "skip_step", 4)]


def test_a_restart_clears_open_anomalies_and_rebuilds_detection_from_the_resume_point():
    from steadytune.records import PlanRevision

    r = Replayer()
    healthy = [3.0 - 0.05 * i + 0.02 * (-1) ** i for i in range(9)]
    for rec in steps([*healthy, math.nan]):  # step 10 is NaN and the worker dies: nan_loss stays open
        r.feed(rec)
    r.pending = "rollback"
    first = r.detector
    r.feed(steps([math.nan], start=11, t0=10.0)[0])  # the dying worker's last record: not fed
    assert anomaly_keys(r.entries) == [("anomaly", "nan_loss", 10)] and r.detector is first
    r.feed(
        PlanRevision(revision=1, ts=20.0, reason="rollback", attempt=1, resume_checkpoint="/x/checkpoint-4")
    )
    assert r.pending is None and r.detector is not first and r.progress.step == 4
    assert anomaly_keys(r.entries)[-1] == ("resolved", "nan_loss", 10)
    for rec in steps(healthy[4:], attempt=1, start=5, t0=21.0):  # steps 5.. trained again, healthy
        r.feed(rec)
    assert len(anomaly_keys(r.entries)) == 2


def test_an_operator_resume_does_not_rewind():
    from steadytune.records import PlanRevision

    r = Replayer()
    first = r.detector
    r.feed(PlanRevision(revision=1, ts=5.0, reason="resume", attempt=1))
    assert r.detector is first and r.attempt == 1


def test_first_difference():
    a = [("anomaly", "x", 1), ("resolved", "x", 2)]
    assert first_difference(a, list(a)) is None
    assert first_difference(a, a[:1]) == 1
    assert first_difference(a, [a[0], ("resolved", "x", 3)]) == 1
    assert Entry("anomaly", "x", 1).key == ("anomaly", "x", 1)


def test_the_alert_telling_of_a_restart_is_recorded_as_an_alert(tmp_path):
    from steadytune.rundir import RunDir
    from steadytune.telemetry.events import EventLog

    run = RunDir(tmp_path / "r")
    run.events.parent.mkdir(parents=True)
    log = EventLog(run.events, "r", audit=False)
    log.append(Event(ts=1.0, kind="action", name="restart", data={"classification": "killed"}))
    log.append(Event(ts=2.0, kind="alert", name="restart", data={"delivered": ["console"]}))
    assert [(e.kind, e.name) for e in recorded(run)] == [("restart", "restart"), ("alert", "restart")]
