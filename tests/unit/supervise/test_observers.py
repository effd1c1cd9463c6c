"""A failing observer is disabled with an event and the run goes on; the observers are flushed once a
second, or at the next tick after an event."""

from __future__ import annotations

from pathlib import Path

from steadytune.records import Event, Record, StepRecord
from steadytune.supervise.observers import Observers
from steadytune.telemetry.events import read_events
from tests.unit.supervise.build import supervisor


class Keeper:
    """Keeps what it is given; ``fail_on`` names the call that raises."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.fail_on = fail_on
        self.records: list[Record] = []
        self.events: list[Event] = []
        self.flushes = 0
        self.closed = False

    def _maybe_fail(self, call: str) -> None:
        if call == self.fail_on:
            raise OSError(f"disk full in {call}")

    def on_record(self, record: Record) -> None:
        self._maybe_fail("on_record")
        self.records.append(record)

    def on_event(self, event: Event) -> None:
        self._maybe_fail("on_event")
        self.events.append(event)

    def flush(self) -> None:
        self._maybe_fail("flush")
        self.flushes += 1

    def close(self) -> None:
        self._maybe_fail("close")
        self.closed = True


def test_an_observer_that_raises_is_disabled_with_an_event_and_the_others_go_on(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    broken, healthy = Keeper(fail_on="on_record"), Keeper()
    sup.out.observers.append(broken)
    sup.out.observers.append(healthy)
    sup.handle(StepRecord(step=1, ts=1.0, loss=1.0, grad_norm=1.0))
    sup.handle(StepRecord(step=2, ts=2.0, loss=1.0, grad_norm=1.0))
    (disabled,) = [e for e in read_events(sup.run.events) if e.name == "observer_disabled"]
    assert disabled.severity == "warning" and disabled.data["observer"] == "Keeper"
    assert disabled.data["call"] == "on_record" and "disk full in on_record" in disabled.data["error"]
    assert [r.step for r in healthy.records] == [1, 2]  # type: ignore[attr-defined]
    assert [e.name for e in healthy.events] == ["observer_disabled"]  # the report reached the others
    assert broken.events == [] and broken not in sup.out.observers.live  # told nothing more


def test_every_observer_is_flushed_and_closed_at_the_end(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    keeper, failing_flush = Keeper(), Keeper(fail_on="flush")
    sup.out.observers.append(keeper)
    sup.out.observers.append(failing_flush)
    sup.pump()
    sup.pump()  # the first flush's failure filed an event: flushed again at once
    assert keeper.flushes == 2 and failing_flush.flushes == 0
    assert [e.data["call"] for e in read_events(sup.run.events) if e.name == "observer_disabled"] == ["flush"]
    sup.out.observers.close()
    assert keeper.closed and not failing_flush.closed


def test_a_report_that_fails_in_the_next_observer_disables_that_one_too() -> None:
    told: list[tuple[str, str]] = []
    first, second = Keeper(fail_on="on_event"), Keeper(fail_on="on_event")
    group = Observers([first, second], report=lambda obs, call, exc: told.append((call, str(exc))))
    group.event(Event(ts=1.0, kind="lifecycle", name="run_started"))
    assert told == [("on_event", "disk full in on_event")] * 2 and group.live == []
    group.event(Event(ts=2.0, kind="lifecycle", name="run_completed"))  # nobody left: nothing raises
    assert len(group.disabled) == 2


def test_records_are_flushed_once_a_second_and_an_event_at_the_next_tick() -> None:
    keeper = Keeper()
    group = Observers([keeper], every_s=1.0)
    group.record(StepRecord(step=1, ts=1.0, loss=1.0))
    group.tick(100.0)
    assert keeper.flushes == 1  # the first tick flushes
    for t in (100.2, 100.4, 100.99):
        group.record(StepRecord(step=2, ts=t, loss=1.0))
        group.tick(t)
    assert keeper.flushes == 1  # records alone wait for the second to pass
    group.tick(101.0)
    assert keeper.flushes == 2
    group.event(Event(ts=101.1, kind="anomaly", name="loss_spike", severity="warning"))
    group.tick(101.1)
    assert keeper.flushes == 3  # an event does not wait
    group.tick(101.2)
    assert keeper.flushes == 3  # and once flushed, the second starts again
