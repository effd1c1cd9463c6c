"""The router: routing by severity, de-duplication, rate limits, resolve, retry with backoff."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from steadytune.alerts import router as router_module
from steadytune.alerts.message import Alert
from steadytune.alerts.router import AlertRouter, lifecycle_phase
from steadytune.alerts.sinks import DeliveryError
from steadytune.config.alerts import AlertsConfig
from steadytune.records import Event
from steadytune.telemetry.events import EventLog, read_events


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


class FakeSink:
    def __init__(
        self, name: str = "fake", min_severity: str | None = None, fail: int = 0, per_hour: int | None = None
    ):
        self.name = name
        self.min_severity = min_severity
        self.rate_limit_per_hour = per_hour
        self.fail = fail  # how many sends fail before one succeeds (-1: always)
        self.sent: list[Alert] = []
        self.tries = 0

    def send(self, alert: Alert) -> None:
        self.tries += 1
        if self.fail < 0 or self.tries <= self.fail:
            raise DeliveryError(f"{self.name}: connection refused")
        self.sent.append(alert)


def anomaly(
    name: str = "loss_spike", severity: str = "warning", metric: str = "loss", step: int = 10
) -> Event:
    return Event(
        ts=0.0, kind="anomaly", name=name, severity=severity, step=step,  # type: ignore[arg-type]
        message=f"{name} at {step}", data={"metric": metric, "cause": "bad batch", "suggestion": "roll back"},
    )  # fmt: skip


def make(tmp_path: Path, sinks: list[FakeSink], clock: Clock, **conf) -> tuple[AlertRouter, EventLog]:
    log = EventLog(tmp_path / "events.jsonl", run_id="r1", clock=clock)
    config = AlertsConfig(**conf)
    return AlertRouter(config, log, clock=clock, run_id="r1", sinks=sinks, start=False), log  # type: ignore[arg-type]


def test_routes_by_min_severity_per_sink(tmp_path: Path) -> None:
    clock = Clock()
    loud, quiet = FakeSink("loud", min_severity="info"), FakeSink("pager", min_severity="critical")
    router, _ = make(tmp_path, [loud, quiet], clock)
    router.submit(anomaly(severity="warning"))
    router.submit(anomaly(name="nan_loss", severity="critical"))
    router.pump()
    assert [a.name for a in loud.sent] == ["loss_spike", "nan_loss"]
    assert [a.name for a in quiet.sent] == ["nan_loss"]


def test_router_floor_applies_without_sink_floor(tmp_path: Path) -> None:
    clock = Clock()
    sink = FakeSink()
    router, _ = make(tmp_path, [sink], clock, min_severity="critical")
    router.submit(anomaly(severity="warning"))
    router.pump()
    assert sink.sent == []


def test_dedup_same_kind_and_metric_inside_window(tmp_path: Path) -> None:
    clock = Clock()
    sink = FakeSink()
    router, _ = make(tmp_path, [sink], clock, dedup_window_s=600)
    router.submit(anomaly(step=10))
    router.pump()
    clock.advance(100)
    router.submit(anomaly(step=20))  # same run, kind, metric: dropped
    router.submit(anomaly(metric="grad_norm", step=20))  # other metric: goes
    router.pump()
    clock.advance(600)
    router.submit(anomaly(step=900))  # window over: goes again
    router.pump()
    assert [(a.metric, a.step) for a in sink.sent] == [("loss", 10), ("grad_norm", 20), ("loss", 900)]


def test_resolved_goes_only_where_the_raise_went_and_reopens_dedup(tmp_path: Path) -> None:
    clock = Clock()
    a, b = FakeSink("a", min_severity="info"), FakeSink("b", min_severity="critical")
    router, _ = make(tmp_path, [a, b], clock)
    router.submit(Event(ts=0, kind="resolved", name="loss_spike", data={"metric": "loss"}))
    router.pump()
    assert a.sent == []  # never raised: nothing to resolve
    router.submit(anomaly())
    router.pump()
    clock.advance(5)
    router.submit(Event(ts=0, kind="resolved", name="loss_spike", step=30, data={"metric": "loss"}))
    router.pump()
    assert [x.kind for x in a.sent] == ["anomaly", "resolved"]
    assert a.sent[1].title.startswith("RESOLVED loss_spike")
    assert b.sent == []
    clock.advance(5)
    router.submit(anomaly(step=40))  # re-raised after a resolve: alerts again despite the window
    router.pump()
    assert [x.step for x in a.sent] == [10, 30, 40]


def test_send_resolved_off(tmp_path: Path) -> None:
    clock = Clock()
    sink = FakeSink()
    router, _ = make(tmp_path, [sink], clock, send_resolved=False)
    router.submit(anomaly())
    router.submit(Event(ts=0, kind="resolved", name="loss_spike", data={"metric": "loss"}))
    router.pump()
    assert [x.kind for x in sink.sent] == ["anomaly"]


def test_rate_limit_holds_back_and_counts(tmp_path: Path) -> None:
    clock = Clock()
    sink = FakeSink(per_hour=2)
    router, log = make(tmp_path, [sink], clock, dedup_window_s=0)
    for i in range(5):
        router.submit(anomaly(name=f"k{i}", step=i))
        router.pump()
        clock.advance(1)
    assert [a.name for a in sink.sent] == ["k0", "k1"]
    clock.advance(3600)
    router.submit(anomaly(name="k9"))
    router.pump()
    assert sink.sent[-1].name == "k9" and sink.sent[-1].suppressed == 3
    assert "3 more alert(s) held back" in sink.sent[-1].text()
    statuses = [e.data["status"] for e in read_events(log.path)]
    assert statuses == ["delivered", "delivered", "held back", "held back", "held back", "delivered"]


def test_critical_may_borrow_over_the_limit(tmp_path: Path) -> None:
    clock = Clock()
    sink = FakeSink(per_hour=2)
    router, _ = make(tmp_path, [sink], clock, dedup_window_s=0)
    for i in range(4):
        router.submit(anomaly(name=f"c{i}", severity="critical"))
    router.pump()
    assert len(sink.sent) == 3


def test_retry_with_exponential_backoff_then_delivered(tmp_path: Path) -> None:
    clock = Clock()
    sink = FakeSink(fail=2)
    router, log = make(tmp_path, [sink], clock, retry={"attempts": 5, "backoff_s": 2, "max_backoff_s": 300})
    router.submit(anomaly())
    assert router.pump() == 1 and sink.tries == 1
    assert router.next_due() == pytest.approx(1002.0)
    clock.advance(1.9)
    assert router.pump() == 0  # not due yet
    clock.advance(0.1)
    assert router.pump() == 1 and sink.tries == 2
    assert router.next_due() == pytest.approx(1006.0)  # 2 s, then 4 s
    clock.advance(4)
    router.pump()
    assert len(sink.sent) == 1 and router.next_due() is None
    (event,) = read_events(log.path)
    assert (
        event.kind == "alert"
        and event.data["delivered"] == ["fake"]
        and event.data["attempts"] == {"fake": 3}
    )


def test_undeliverable_alert_is_recorded_undelivered(tmp_path: Path) -> None:
    clock = Clock()
    dead, ok = FakeSink("dead", fail=-1), FakeSink("ok")
    router, log = make(tmp_path, [dead, ok], clock, retry={"attempts": 3, "backoff_s": 1, "max_backoff_s": 2})
    router.submit(anomaly(severity="critical"))
    for _ in range(5):
        router.pump()
        clock.advance(10)
    assert dead.tries == 3
    (event,) = read_events(log.path)
    assert event.kind == "alert" and event.severity == "critical"
    assert event.data["status"] == "partial"
    assert event.data["delivered"] == ["ok"]
    assert "connection refused" in event.data["undelivered"]["dead"]


@pytest.mark.parametrize("paused", [False, True])
def test_close_gives_pending_one_last_try_then_marks_undelivered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, paused: bool
) -> None:
    if paused:
        # Every look at the monotonic clock comes 2 s after the one before: the process was
        # descheduled for longer than close()'s timeout before its first look. The try is still made.
        ticks = iter(range(0, 10_000, 2))
        monkeypatch.setattr(router_module, "time", SimpleNamespace(monotonic=lambda: float(next(ticks))))
    clock = Clock()
    dead = FakeSink("dead", fail=-1)
    router, log = make(tmp_path, [dead], clock, retry={"attempts": 10, "backoff_s": 60, "max_backoff_s": 600})
    router.submit(anomaly())
    router.pump()
    router.close(timeout=1)
    assert dead.tries == 2
    (event,) = read_events(log.path)
    assert event.data["status"] == "undelivered"


def test_lifecycle_options(tmp_path: Path) -> None:
    """The names the supervisor files: its restarts and the run's end pass; a policy's restart
    request, a pause and a start (not asked for) do not."""
    clock = Clock()
    sink = FakeSink(min_severity=None)
    router, _ = make(tmp_path, [sink], clock, notify_on={"start": False, "finish": True, "restart": True})
    router.submit(Event(ts=0, kind="lifecycle", name="run_started", severity="info"))
    router.submit(Event(ts=0, kind="action", name="restart", severity="warning", data={"reason": "hang"}))
    router.submit(Event(ts=0, kind="action", name="restart", severity="warning", data={"classification": 1}))
    router.submit(Event(ts=0, kind="lifecycle", name="run_paused", severity="info"))
    router.submit(Event(ts=0, kind="lifecycle", name="run_completed", severity="info"))
    router.submit(Event(ts=0, kind="lifecycle", name="run_failed", severity="critical"))
    router.pump()
    assert [(a.kind, a.name) for a in sink.sent] == [
        ("action", "restart"),
        ("lifecycle", "run_completed"),
        ("lifecycle", "run_failed"),
    ]
    assert lifecycle_phase(Event(ts=0, kind="lifecycle", name="FAILED")) == "finish"
    assert lifecycle_phase(Event(ts=0, kind="anomaly", name="run_failed")) is None


def test_lifecycle_alerts_can_be_switched_off(tmp_path: Path) -> None:
    clock = Clock()
    sink = FakeSink(min_severity=None)
    router, _ = make(tmp_path, [sink], clock, notify_on={"start": False, "finish": False, "restart": False})
    router.submit(Event(ts=0, kind="action", name="restart", severity="warning", data={"classification": 1}))
    router.submit(Event(ts=0, kind="lifecycle", name="run_failed", severity="critical"))
    router.pump()
    assert sink.sent == []


def test_alert_and_control_events_never_loop(tmp_path: Path) -> None:
    clock = Clock()
    sink = FakeSink()
    log = EventLog(tmp_path / "events.jsonl", run_id="r1", clock=clock)
    router = AlertRouter(AlertsConfig(), log, clock=clock, sinks=[sink], start=False)  # type: ignore[list-item]
    log.on_append = router  # the supervisor's wiring: every appended event is submitted
    log.append(anomaly(severity="critical"))
    router.pump()
    router.pump()  # the router's own alert event came back through the hook and was ignored
    assert len(sink.sent) == 1
    assert [e.kind for e in read_events(log.path)] == ["anomaly", "alert"]


def test_background_thread_delivers_without_blocking(tmp_path: Path) -> None:
    import threading

    from tests.waiting import wait_for

    entered, gate = threading.Event(), threading.Event()

    class SlowSink(FakeSink):
        def send(self, alert: Alert) -> None:
            entered.set()
            gate.wait(60)  # held until the test lets go: a submit that waited for it would hang here
            super().send(alert)

    sink = SlowSink()
    log = EventLog(tmp_path / "events.jsonl", run_id="r1")
    router = AlertRouter(AlertsConfig(), log, sinks=[sink])  # type: ignore[list-item]
    router.submit(anomaly())
    assert sink.sent == []  # submit returned while the delivery is still held
    wait_for(entered.is_set, timeout=30, what="the delivery thread to reach the sink")
    gate.set()
    router.close(timeout=30)
    assert len(sink.sent) == 1


def test_secret_is_redacted_from_recorded_errors(tmp_path: Path) -> None:
    clock = Clock()
    router, log = make(tmp_path, [], clock)
    router.redactor.add("https://hooks.example/T000/B000/XXXXSECRET")

    class Leaky(FakeSink):
        def send(self, alert: Alert) -> None:
            raise RuntimeError("POST https://hooks.example/T000/B000/XXXXSECRET failed")

    router.sinks.append(Leaky("leaky"))  # type: ignore[arg-type]
    router._limiters.append(__import__("steadytune.alerts.noise", fromlist=["RateLimiter"]).RateLimiter(10))
    router.config = AlertsConfig(retry={"attempts": 1})
    router.submit(anomaly())
    router.pump()
    text = log.path.read_text()
    assert "XXXXSECRET" not in text and "***" in text


def test_console_sink_leaves_to_the_host_console_what_it_printed(tmp_path: Path) -> None:
    """Beside a console that prints warnings, the console sink writes only the rest (a
    RESOLVED info), yet every alert is recorded delivered to it."""
    import io

    from steadytune.alerts.sinks import ConsoleAlertSink
    from steadytune.config.alerts import ConsoleSink
    from steadytune.redact import Redactor
    from steadytune.supervise.outbox import said_on_console
    from steadytune.telemetry.events import read_events

    clock = Clock()
    stream = io.StringIO()
    sink = ConsoleAlertSink(ConsoleSink(type="console"), Redactor(), stream, already_said=said_on_console)
    router, log = make(tmp_path, [sink], clock)  # type: ignore[list-item]
    router.submit(anomaly(severity="critical"))
    router.submit(Event(ts=0, kind="resolved", name="loss_spike", severity="info", data={"metric": "loss"}))
    router.pump()
    assert stream.getvalue().count("\n") == 1 and "RESOLVED loss_spike" in stream.getvalue()
    assert [e.data["delivered"] for e in read_events(log.path)] == [["console"], ["console"]]
