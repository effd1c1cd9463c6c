"""One alert per episode, an update when its severity rises, never one per point.

A real Supervisor files what its detector raises, a real alert router delivers it over HTTP to the
local webhook receiver the tests use. The run's disk hovers at the warning line (it dips, recovers,
dips again: the condition flickers), then falls to the critical share, then recovers for good.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from steadytune.alerts.router import AlertRouter
from steadytune.records import StepRecord, SystemSample
from steadytune.supervise.observers import AlertObserver
from steadytune.supervise.supervisor import Supervisor
from steadytune.telemetry.events import read_events
from steadytune.web.api import series
from steadytune.web.metrics import active_anomalies
from steadytune.web.runs import RunsIndex
from tests.servers import Hook
from tests.unit.supervise.build import supervisor

GIB = 1 << 30


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.close()


def _supervisor(tmp_path: Path, hook: Hook) -> tuple[Supervisor, AlertRouter]:
    alerts = {"sinks": [{"type": "webhook", "url_env": "HOOK", "timeout_s": 5}], "send_resolved": True}
    sup = supervisor(tmp_path, alerts=alerts)
    router = AlertRouter(
        sup.cfg.alerts,
        sup.out.events,
        clock=sup.state.clock,
        run_id=sup.run.run_id,
        environ={"HOOK": hook.url},
        start=False,
    )
    sup.out.observers.append(AlertObserver(router))
    return sup, router


def _disk(ts: float, free: float) -> SystemSample:
    return SystemSample(ts=ts, disk_free_bytes=int(free * 1000 * GIB), disk_total_bytes=1000 * GIB)


def test_a_flickering_condition_alerts_once_and_again_only_when_it_worsens(
    tmp_path: Path, hook: Hook
) -> None:
    sup, router = _supervisor(tmp_path, hook)
    step = 0

    def steps(n: int) -> None:
        nonlocal step
        for _ in range(n):
            step += 1
            sup.handle(StepRecord(step=step, ts=float(step), loss=2.0 - 0.001 * step, grad_norm=1.0))

    steps(20)
    for k in range(6):  # dips under 5% free and recovers past 6%, six times, a few steps apart
        sup.handle(_disk(100.0 + k, 0.04))
        steps(2)
        sup.handle(_disk(100.5 + k, 0.07))
        steps(2)
    sup.handle(_disk(200.0, 0.01))  # now critical: the same episode, worse
    sup.handle(_disk(201.0, 0.07))
    steps(40)  # quiet for longer than the episode gap: the episode ends
    router.pump()

    sent = [(b["alert"]["kind"], b["alert"]["name"], b["alert"]["severity"]) for b in hook.bodies]
    assert sent == [
        ("anomaly", "disk_low", "warning"),
        ("anomaly", "disk_low", "critical"),  # the update: its severity rose
        ("resolved", "disk_low", "info"),
    ]
    filed = [e for e in read_events(sup.run.events) if e.name == "disk_low" and e.kind != "alert"]
    assert [(e.kind, e.data.get("escalated_from")) for e in filed] == [
        ("anomaly", None),
        ("anomaly", "warning"),
        ("resolved", None),
    ]
    assert filed[-1].data["count"] == 7  # six dips and the fall: one episode, counted
    router.close(timeout=5)


def test_a_spike_that_grows_into_an_explosion_is_one_episode_told_twice_and_ended_once(
    tmp_path: Path, hook: Hook
) -> None:
    """The norm jumps 12x, then 400x two steps later: the people told of the spike hear it grew into an
    explosion and when that one trouble ended; the policy acts on the explosion."""
    sup, router = _supervisor(tmp_path, hook)
    for n in range(1, 101):
        norm = 1.0 + 0.02 * (n % 3) + (11.0 if n == 40 else 0.0) + (399.0 if n == 42 else 0.0)
        sup.handle(StepRecord(step=n, ts=float(n), loss=2.0 - 0.001 * n, grad_norm=norm))
    router.pump()

    sent = [(b["alert"]["kind"], b["alert"]["name"], b["alert"]["severity"]) for b in hook.bodies]
    assert sent == [
        ("anomaly", "grad_spike", "warning"),
        ("anomaly", "grad_explosion", "critical"),
        ("resolved", "grad_explosion", "info"),
    ]
    events = read_events(sup.run.events)
    told = [(e.kind, e.name, e.step) for e in events if e.kind in ("anomaly", "resolved")]
    assert told == [
        ("anomaly", "grad_spike", 40),
        ("anomaly", "grad_explosion", 40),
        ("resolved", "grad_explosion", 42),
    ]
    grew = next(e for e in events if e.name == "grad_explosion")
    assert grew.data["escalated_from"] == "warning"
    assert grew.data["grew_out_of"] == [["grad_spike", "grad_norm"]]
    assert "grew out of the grad_spike raised at step 40" in grew.message
    # The batch's inspection is an action event too, in either order with the rollback.
    acted = [(e.step, e.data.get("anomaly")) for e in events if e.kind == "action" and e.name == "rollback"]
    assert acted == [(42, "grad_explosion")]
    # The dashboard draws the episode once, as what it became.
    index = RunsIndex(tmp_path / "runs", cache_dir=tmp_path / "cache")
    index.refresh_all()
    entry = index.get(sup.run.run_id)
    assert entry is not None
    marks = [(m["step"], m["name"], m["severity"]) for m in series(entry)["anomalies"]]
    assert marks == [(40, "grad_explosion", "critical")]
    # /metrics: nothing left open once the one trouble ended (the spike it grew from included).
    assert active_anomalies(entry) == {}
